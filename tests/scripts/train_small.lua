-- A small training run touching every kind of op (conv, norms, attention,
-- GEGLU, dropout, upsampling); prints every loss and every parameter in hex
-- floats, so two runs can be compared bit for bit.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2, 4, 8, 8})
local ctx = g:input("ctx", {2, 5, 16})
local noise = g:input("noise", {2, 4, 8, 8})
local h = ck.conv2d(x, g:param("conv_in.weight", {16, 4, 3, 3}), g:param("conv_in.bias", {16}), {padding = 1})
h = ck.silu(ck.group_norm(h, 4, g:param("norm.weight", {16}, {init = "ones"}), g:param("norm.bias", {16})))
local d = ck.conv2d(h, g:param("down.weight", {16, 16, 3, 3}), nil, {stride = 2, padding = 1})
local seq = ck.permute(ck.reshape(d, {2, 16, 16}), {0, 2, 1})
seq = ck.layer_norm(seq, g:param("ln.weight", {16}, {init = "ones"}), g:param("ln.bias", {16}))
local q = ck.linear(seq, g:param("to_q.weight", {16, 16}))
local k = ck.linear(ctx, g:param("to_k.weight", {16, 16}))
local v = ck.linear(ctx, g:param("to_v.weight", {16, 16}))
local a = ck.attention(q, k, v, 2)
a = ck.geglu(ck.linear(ck.dropout(a, 0.1), g:param("ff.weight", {32, 16}), g:param("ff.bias", {32})))
local up = ck.upsample2x(ck.reshape(ck.permute(a, {0, 2, 1}), {2, 16, 4, 4}))
local out = ck.conv2d(ck.concat(up, h, 1), g:param("conv_out.weight", {4, 32, 3, 3}), g:param("conv_out.bias", {4}), {padding = 1})
local loss = ck.mse_loss(out, noise)
local p = g:compile{loss = loss, optimizer = "adamw", lr = 1e-3, seed = 11}
local function fill(n, s)
  local t = {}
  for i = 1, n do t[i] = math.sin(i * s) end
  return t
end
p:set(x, fill(2 * 4 * 64, 0.37)); p:set(ctx, fill(2 * 5 * 16, 0.11)); p:set(noise, fill(2 * 4 * 64, 0.73))
for s = 1, (args.steps or 5) do print(string.format("loss %d %a", s, p:step())) end
for _, t in ipairs(g:params()) do
  local vals = p:get(t.name)
  local parts = {}
  for i = 1, #vals do parts[i] = string.format("%a", vals[i]) end
  print(t.name, table.concat(parts, " "))
end

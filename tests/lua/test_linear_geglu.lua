-- LINEAR_GEGLU: a Linear whose output only a GEGLU reads (every feed-forward's
-- net.0.proj), as one op that also outputs the product h for its backward. On
-- the CPU it is the pair's arithmetic: the output, the loss and every gradient
-- bitwise those of geglu(linear(x, w, b)), in fp32, bf16 and fp16, with and
-- without a bias, erf and tanh; sdxl-tiny builds it in each transformer
-- block's feed-forward, in net.0.proj's scope with the same parameter names,
-- and trains bitwise as the unfused graph under none, recompute of the fused
-- op, diffusers and selective; an adapted net.0.proj (kohya's targets) builds
-- the pair, since the adapter's branch sits between the two.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local nn = require "ck.nn"
local T = require "check"
local unet = require "ck.unet"
local lora = require "ck.lora"
local policy = require "ck.policy"

-- loss = mean(f(x) * R), f the pair or the fused op; x a parameter (dx wanted)
-- or an input; every parameter and output checksummed
local function op_step(c, fused)
  local g = ck.graph()
  local rows, IN, D = c.rows, c.IN, c.D
  local x = c.x_grad and g:param("x", {rows, IN}, {init = "zeros"}) or g:input("x", {rows, IN})
  local w = g:param("w", {2 * D, IN}, {init = "zeros"})
  local b = c.bias and g:param("b", {2 * D}, {init = "zeros"}) or nil
  local y
  if fused then y = ck.linear_geglu(x, w, b, c.approx)
  else y = ck.geglu(ck.linear(x, w, b), c.approx) end
  local R = g:input("R", y.shape)
  -- fp16's loss scaling needs an optimizer: SGD at a rate of 0 (the kept gradients are scaled alike)
  local p = g:compile{loss = ck.mean(y * R), optimizer = c.precision == "fp16" and "sgd" or "none", lr = 0,
                      weight_decay = 0, keep_grads = true, outputs = {y}, precision = c.precision, device = "cpu"}
  local r = T.rng(11)
  p:set(x, T.random_values(r, rows * IN, -2, 2))
  p:set(w, T.random_values(r, 2 * D * IN, -0.5, 0.5))
  if b then p:set(b, T.random_values(r, 2 * D, -1, 1)) end
  p:set(R, T.random_values(r, rows * D, -1, 1))
  local loss = p:step()
  local s = {loss, p:checksum(y), p:checksum("w", "grad")}
  if b then s[#s + 1] = p:checksum("b", "grad") end
  if c.x_grad then s[#s + 1] = p:checksum("x", "grad") end
  return table.concat(s, " "), g:node_count()
end

for _, c in ipairs{
  {rows = 6, IN = 5, D = 4, bias = true, x_grad = true},
  {rows = 7, IN = 3, D = 6, bias = false, x_grad = true, approx = "tanh"},
  {rows = 33, IN = 16, D = 40, bias = true, x_grad = false},
  {rows = 9, IN = 8, D = 16, bias = true, x_grad = true, precision = "bf16"},
  {rows = 9, IN = 8, D = 16, bias = true, x_grad = true, precision = "fp16"},
  {rows = 5, IN = 6, D = 8, bias = false, x_grad = false, precision = "bf16", approx = "tanh"},
} do
  local a, na = op_step(c, false)
  local b, nb = op_step(c, true)
  T.ok(a == b and nb == na - 1, string.format(
    "%dx%d -> 2x%d %s%s%s%s: output, loss and gradients bitwise those of linear then geglu, one node fewer", c.rows,
    c.IN, c.D, c.precision or "fp32", c.bias and ", bias" or "", c.x_grad and "" or ", dx unwanted",
    c.approx and ", tanh" or ""))
end

do -- shapes: h is the product's, y half its width; a wrong weight is refused naming the script line
  local g = ck.graph()
  local x = g:input("x", {2, 3, 5})
  local y = ck.linear_geglu(x, g:param("w", {8, 5}), g:param("b", {8}))
  T.ok(table.concat(y.shape, ",") == "2,3,4", "linear_geglu: [2,3,5] by an [8,5] weight gives [2,3,4]")
  local ok, err = pcall(ck.linear_geglu, x, g:param("w2", {7, 5}))
  T.ok(not ok and err:match("test_linear_geglu%.lua:%d+:") and err:match("even"), "an odd product width is refused: " ..
    tostring(err))
  ok, err = pcall(ck.linear_geglu, x, g:param("w3", {8, 4}))
  T.ok(not ok and err:match("test_linear_geglu%.lua:%d+:") and err:match("features"),
    "a weight of the wrong width is refused: " .. tostring(err))
end

local function build(fuse, opts, adapters)
  nn.fuse_linear_geglu = fuse
  local model = unet.UNet2DConditionModel(unet.config("sdxl-tiny"))
  if adapters then lora.attach(model, {rank = 2, targets = adapters}) end
  local c = {optimizer = "adamw", lr = 1e-3, seed = 5, keep_grads = true, device = "cpu"}
  for k, v in pairs(opts or {}) do c[k] = v end
  local g, p = T.unet_step(model, {batch = 2, height = 8, frozen = adapters ~= nil}, c)
  nn.fuse_linear_geglu = true
  return g, p
end

local run = T.train_digest

-- the scopes in which a policy sees linear_geglu (once a scope: it sees both outputs, y and h)
local function fused_scopes(fuse, adapters)
  local scopes, seen = {}, {}
  local function see(t)
    if t.op == "linear_geglu" and not seen[t.scope] then
      seen[t.scope] = true
      scopes[#scopes + 1] = t.scope
    end
    return "save"
  end
  build(fuse, {checkpoint = see}, adapters)
  return scopes
end

do -- the graph: one node fewer a feed-forward, the same parameter names, the op in net.0.proj's scope
  local ga, pa = build(false)
  local gb, pb = build(true)
  local na, nb = {}, {}
  for _, prm in ipairs(ga:params()) do na[#na + 1] = prm.name end
  for _, prm in ipairs(gb:params()) do nb[#nb + 1] = prm.name end
  T.ok(#na > 0 and table.concat(na, " ") == table.concat(nb, " "),
    string.format("the %d parameter names (state-dict keys) are those of the unfused graph", #nb))
  local scopes = fused_scopes(true)
  local ff, others = 0, 0
  for _, s in ipairs(scopes) do
    if s:match("%.transformer_blocks%.%d+%.ff%.net%.0%.proj$") then ff = ff + 1 else others = others + 1 end
  end
  T.ok(ff > 0 and others == 0, string.format("a policy sees linear_geglu in %d feed-forwards' net.0.proj scopes", ff))
  T.ok(#fused_scopes(false) == 0, "nn.fuse_linear_geglu = false builds the pair")
  T.ok(ga:node_count() - gb:node_count() == #scopes, string.format(
    "one node fewer for each of the %d fused products (%d against %d)", #scopes, gb:node_count(), ga:node_count()))
  T.ok(run(ga, pa) == run(gb, pb), "sdxl-tiny: two AdamW steps' losses, gradients and weights bitwise those of the unfused graph")
end

do -- recompute: the fused op replayed gives what it saved; policies give none's results fused and not
  local base = run(build(true))
  local recomputed = 0
  local function products(t)
    if t.op == "linear_geglu" then recomputed = recomputed + 1; return "recompute" end
    return "save"
  end
  T.ok(run(build(true, {checkpoint = products})) == base and recomputed > 0, string.format(
    "recomputing the fused products (%d outputs): bitwise the losses and gradients of saving them", recomputed))
  for _, e in ipairs{{"diffusers", policy.diffusers()}, {"selective", policy.selective()}} do
    T.ok(run(build(true, {checkpoint = e[2]})) == base and run(build(false, {checkpoint = e[2]})) == base, string.format(
      "%s: fused and unfused, bitwise the losses and gradients of none", e[1]))
  end
end

do -- adapters: an adapted net.0.proj builds the pair; attention adapters leave it fused; both train as unfused
  local kohya = fused_scopes(true, lora.KOHYA_TARGETS)
  local attn = fused_scopes(true, lora.DEFAULT_TARGETS)
  T.ok(#kohya == 0 and #attn > 0, string.format(
    "kohya's targets (net.0.proj adapted): no fused product; attention targets: %d fused", #attn))
  for _, e in ipairs{{"kohya", lora.KOHYA_TARGETS}, {"attention", lora.DEFAULT_TARGETS}} do
    T.ok(run(build(true, nil, e[2])) == run(build(false, nil, e[2])), string.format(
      "LoRA on %s targets: the adapters' losses and gradients bitwise those of the unfused graph", e[1]))
  end
end

do -- bf16 on sdxl-tiny: the fused graph trains bitwise as the pair in 16 bits too
  T.ok(run(build(true, {precision = "bf16"})) == run(build(false, {precision = "bf16"})),
    "sdxl-tiny in bf16: losses, gradients and weights bitwise those of the unfused graph")
end

T.done()

-- GROUP_NORM_SILU: a group norm whose output only SiLU reads, as one op. On
-- the CPU it is the pair's arithmetic: outputs and gradients bitwise those of
-- silu(group_norm(x)), channels longer than the backward's chunk included; the
-- UNet builds it in every ResNet block (norm1, norm2) and at conv_norm_out, in
-- the norm's scope, with the parameter names of before; sdxl-tiny's losses and
-- gradients are bitwise those of the unfused graph under none and under
-- recompute; the plan holds fewer activation bytes; recompute of the fused op
-- is bitwise; and the VAE's decoder, which fuses too, draws the same image.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local nn = require "ck.nn"
local T = require "check"
local policy = require "ck.policy"

-- loss = mean(f(x) * R); x an input when x_grad is false (dx unwanted)
local function pair_step(shape, groups, eps, fused, x_grad)
  local g = ck.graph()
  local c = shape[2]
  local x = x_grad and g:param("x", shape, {init = "zeros"}) or g:input("x", shape)
  local gamma, beta = g:param("gamma", {c}, {init = "zeros"}), g:param("beta", {c}, {init = "zeros"})
  local y = fused and ck.group_norm_silu(x, groups, gamma, beta, eps) or ck.silu(ck.group_norm(x, groups, gamma, beta, eps))
  local R = g:input("R", y.shape)
  local p = g:compile{loss = ck.mean(y * R), optimizer = "none", keep_grads = true, outputs = {y}}
  local r = T.rng(9)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  p:set(x, T.random_values(r, n, -3, 5))
  p:set(gamma, T.random_values(r, c, 0.5, 1.5))
  p:set(beta, T.random_values(r, c, -1, 1))
  p:set(R, T.random_values(r, n, -1, 1))
  local loss = p:step()
  local s = {loss, p:checksum(y), p:checksum("gamma", "grad"), p:checksum("beta", "grad")}
  if x_grad then s[#s + 1] = p:checksum("x", "grad") end
  return table.concat(s, " ")
end

for _, c in ipairs{
  {{2, 6, 5, 3}, 3, 1e-5, true},
  {{3, 8}, 4, 1e-6, true},
  {{2, 4, 7}, 1, 1e-6, false},
  -- 2500 positions a channel: the backward's 2048-value pieces and a tail
  {{1, 4, 50, 50}, 2, 1e-5, true},
  {{2, 8, 47, 48}, 4, 1e-5, false},
} do
  local a, b = pair_step(c[1], c[2], c[3], false, c[4]), pair_step(c[1], c[2], c[3], true, c[4])
  T.ok(a == b, string.format("[%s] %d groups%s: output, loss and gradients bitwise those of group_norm then silu",
    table.concat(c[1], ","), c[2], c[4] and "" or " (dx unwanted)"))
end

local function build(fuse, opts)
  nn.fuse_norm_silu = fuse
  local c = {optimizer = "adamw", lr = 1e-3, seed = 5, keep_grads = true}
  for k, v in pairs(opts or {}) do c[k] = v end
  local g, p = T.unet_step("sdxl-tiny", {batch = 2, height = 8}, c)
  nn.fuse_norm_silu = true
  return g, p
end

local run = T.train_digest

do -- the graph: fewer nodes, the same parameter names, the fused op in the norms' scopes
  local ga, pa = build(false)
  local gb, pb = build(true)
  local na, nb = {}, {}
  for _, prm in ipairs(ga:params()) do na[#na + 1] = prm.name end
  for _, prm in ipairs(gb:params()) do nb[#nb + 1] = prm.name end
  T.ok(#na > 0 and table.concat(na, " ") == table.concat(nb, " "),
    string.format("the %d parameter names (state-dict keys) are those of the unfused graph", #nb))
  -- sdxl-tiny: the ResNet blocks' norm1 and norm2, and conv_norm_out
  local scopes = {}
  local function see(t)
    if t.op == "group_norm_silu" then scopes[#scopes + 1] = t.scope end
    return "save"
  end
  build(true, {checkpoint = see})
  local resnet_norms, others = 0, 0
  for _, s in ipairs(scopes) do
    if s:match("%.resnets%.%d+%.norm[12]$") then resnet_norms = resnet_norms + 1
    elseif s == "conv_norm_out" then others = others + 1
    else others = others + 100 end
  end
  T.ok(resnet_norms > 0 and resnet_norms % 2 == 0 and others == 1, string.format(
    "a policy sees group_norm_silu in diffusers' scopes: %d resnet norms (norm1, norm2) and conv_norm_out", resnet_norms))
  T.ok(ga:node_count() - gb:node_count() == #scopes, string.format(
    "one node fewer for each of the %d fused norms (%d against %d)", #scopes, gb:node_count(), ga:node_count()))
  local a, b = pa:plan(), pb:plan()
  T.ok(b.activation_bytes < a.activation_bytes and b.peak < a.peak, string.format(
    "fused: %d bytes saved for backward against %d, peak %d against %d", b.activation_bytes, a.activation_bytes,
    b.peak, a.peak))
  T.ok(run(ga, pa) == run(gb, pb), "sdxl-tiny: two AdamW steps' losses, gradients and weights bitwise those of the unfused graph")
end

do -- recompute: the fused op replayed gives bitwise what it saved, and equals the unfused graph recomputed
  local base = run(build(true))
  local recomputed = 0
  local function norms(t)
    if t.op == "group_norm_silu" then recomputed = recomputed + 1; return "recompute" end
    return "save"
  end
  T.ok(run(build(true, {checkpoint = norms})) == base and recomputed > 0, string.format(
    "recomputing the %d fused norms: bitwise the losses and gradients of saving them", recomputed))
  for _, e in ipairs{{"diffusers", policy.diffusers()}, {"selective", policy.selective()}} do
    T.ok(run(build(true, {checkpoint = e[2]})) == base and run(build(false, {checkpoint = e[2]})) == base, string.format(
      "%s: fused and unfused, bitwise the losses and gradients of none", e[1]))
  end
end

do -- the VAE (its ResNet blocks and conv_norm_out): the tiny decoder's image, fused and not
  local vae = require "ck.vae"
  local function image(fuse)
    nn.fuse_norm_silu = fuse
    local g = ck.graph()
    local _, img = vae.build_decoder(g, "tiny", {height = 4})
    nn.fuse_norm_silu = true
    local p = g:compile{outputs = {img}, seed = 2}
    T.set_random(p, 4, {g:get("latents")})
    p:forward()
    return p:checksum(img), g:node_count()
  end
  local a, na = image(false)
  local b, nb = image(true)
  T.ok(a == b and nb < na, string.format("the tiny VAE decoder: bitwise the same image from %d nodes instead of %d", nb, na))
end

T.done()

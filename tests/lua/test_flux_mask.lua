-- kohya's --apply_t5_attn_mask in ck.flux's joint attention (flux.inputs{mask
-- = true}, flux.joint_mask): a sample's padded text tokens are left out of
-- every attention of the transformer, so what T5 put at a pad cannot reach
-- the output; a kept token can; without the mask the pads are attended; a
-- mask keeping every token computes what the unmasked transformer computes.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local flux = require "ck.flux"

local B, LT, H, W = 2, 6, 4, 4
local c = flux.config("flux-tiny")
local KEEP = {1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0} -- sample 1 keeps 3 tokens, sample 2 keeps 5

local function program(mask)
  local g = ck.graph()
  local _, y, x = flux.build(g, "flux-tiny", {batch = B, height = H, width = W, tokens = LT, mask = mask})
  return g:compile{outputs = {y}, optimizer = "none", seed = 3}, x, y
end

local function values(n, key, scale)
  local v = {}
  for i = 1, n do v[i] = scale * ck.randn(11, 0, key, i) end
  return v
end

local TEXT = values(B * LT * c.joint_attention_dim, 1, 1.0)

-- the output for text states `text` (and the mask `keep`, for a masked program)
local function run(p, x, y, text, keep)
  p:set(x.hidden_states, values(B * (H // 2) * (W // 2) * c.in_channels, 2, 1.0))
  p:set(x.encoder_hidden_states, text)
  p:set(x.pooled_projections, values(B * c.pooled_projection_dim, 3, 1.0))
  p:set(x.timestep, {0.3, 0.8})
  p:set(x.guidance, {3.5, 3.5})
  p:set(x.rope, flux.rope_values(c, LT, H, W))
  if x.t5_attn_mask then
    p:set(x.t5_attn_mask, keep)
    p:set(x.joint_ones, 1)
  end
  p:forward()
  return p:get(y)
end

-- text with the states of token t of sample b (1-based) changed
local function changed(b, t)
  local out, D = {}, c.joint_attention_dim
  for i, v in ipairs(TEXT) do out[i] = v end
  local at = ((b - 1) * LT + (t - 1)) * D
  for j = 1, D do out[at + j] = out[at + j] + 5 end
  return out
end

local function same(a, b)
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return #a == #b
end

local function rel(a, b)
  local num, den = 0, 0
  for i = 1, #a do num = num + (a[i] - b[i]) ^ 2; den = den + b[i] ^ 2 end
  return math.sqrt(num / den)
end

local p, x, y = program(true)
local base = run(p, x, y, TEXT, KEEP)
T.ok(same(base, run(p, x, y, changed(1, 5), KEEP)) and same(base, run(p, x, y, changed(2, 6), KEEP)),
  "with the mask, a padded token's text states leave the output bitwise as it was")
T.ok(not same(base, run(p, x, y, changed(1, 2), KEEP)) and not same(base, run(p, x, y, changed(2, 5), KEEP)),
  "a kept token's text states change the output")

local q, xq, yq = program(false)
local plain = run(q, xq, yq, TEXT)
T.ok(not same(plain, run(q, xq, yq, changed(1, 5))), "without the mask the padded token is attended")

local all = {}
for i = 1, B * LT do all[i] = 1 end
local r = rel(run(p, x, y, TEXT, all), plain)
T.ok(r < 1e-5, string.format("a mask keeping every token computes the unmasked transformer's output (rel %.1e)", r))

T.done()

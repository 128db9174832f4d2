-- A model family of its own through ck.train, which asks no family which it
-- is: a toy denoiser of latents packed 2x2 into tokens (as Flux packs them),
-- conditioned on one text tensor by cross-attention and on the noise level by
-- adaLN's modulate, trained by flow matching (x_s = (1 - s) x0 + s eps, the
-- target eps - x0, s = sigmoid(N(0, 1)) per sample: kohya's "sigmoid"), with
-- no size conditioning (no time_ids). tests/sh/test_train_family.sh runs it.
local ck = require "ck"
local nn = require "ck.nn"
local lora = require "ck.lora"
local data = require "ck.data"

local C, D, T, W = 4, 8, 3, 16 -- latent channels, text width, text tokens, model width
local KEY_SIGMA, KEY_NOISE = 0x7D00, 0x7D01

local Toy = nn.class("Toy")
function Toy:init()
  self:add("img_in", nn.Linear{4 * C, W})
  self:add("txt_in", nn.Linear{D, W})
  self:add("time_shift", nn.Linear{W, W})
  self:add("time_scale", nn.Linear{W, W})
  self:add("proj_out", nn.Linear{W, 4 * C})
end
-- x [B, L, 4C] tokens, s [B] noise levels, text [B, T, D]
function Toy:updateOutput(g, x, s, text)
  local m = {}
  for _, c in ipairs(self.children) do m[c.name] = c end
  local h = m.img_in:forward(g, x)
  local k = m.txt_in:forward(g, text)
  h = h + ck.attention(h, k, k, 2)
  local temb = ck.timestep_embedding(ck.scale(s, 1000), W, {})
  h = ck.modulate(h, m.time_shift:forward(g, temb), m.time_scale:forward(g, temb))
  return m.proj_out:forward(g, ck.silu(h))
end

-- [B, C, H, W] -> [B, H/2 * W/2, 4C], as Flux's _pack_latents
local function pack(x, b, h, w)
  return ck.reshape(ck.permute(ck.reshape(x, {b, C, h // 2, 2, w // 2, 2}), {0, 2, 4, 1, 3, 5}),
    {b, (h // 2) * (w // 2), 4 * C})
end

-- flow matching: the loss and the draws of each step
local Flow = {}
Flow.__index = Flow
function Flow:build(g, model, b, h, w)
  local x0, noise = g:input("latents", {b, C, h, w}), g:input("noise", {b, C, h, w})
  local sigma, weight = g:input("sigmas", {b, 1, 1, 1}), g:input("loss_weight", {b, 1, 1})
  self.inputs = {latents = x0, noise = noise, sigmas = sigma, weight = weight, text_embeds = g:input("text_embeds", {b, T, D})}
  self.b = b
  local noisy = x0 - x0 * sigma + noise * sigma
  local pred = model:forward(g, pack(noisy, b, h, w), ck.reshape(sigma, {b}), self.inputs.text_embeds)
  local d = pred - pack(noise - x0, b, h, w)
  return ck.mean(d * d * weight)
end
function Flow:prepare(p, given, step)
  step = step or p.steps + 1
  local rows, scale = given.rows, given.weight_scale or 1
  local sig, w = {}, {}
  for i = 1, self.b do
    local z = ck.randn(self.seed, step, KEY_SIGMA, rows and rows[i] or i - 1)
    sig[i], w[i] = 1 / (1 + math.exp(-z)), scale
  end
  p:set(self.inputs.sigmas, sig)
  p:set(self.inputs.weight, w)
  p:randn(self.inputs.noise, KEY_NOISE, 1.0, step, rows)
end

local family = {name = "toy", noun = "denoiser", base_files = "none: the toy family has no base files",
                blocks = {"*"}, adapter_options = {}, defaults = {batch = {2}}}
family.options = {
  {"targets", "string", "img_in,proj_out", "the adapted modules", arg = "a,b,c"},
}

function family.model(o)
  if o["pretrained-model-name-or-path"] then error("the toy family has no base files") end
  return {size = "toy", label = "toy", title = "toy", channels = C, factor = 2, seed = o.seed,
          objective_words = "flow matching", targets = require("ck.options").types.list(nil, o.targets)}
end
function family.adapter(m, a)
  return {rank = a.rank, alpha = a.alpha, targets = m.targets, dropout = a.dropout, loraplus_lr_ratio = a.loraplus_lr_ratio}
end
function family.adapter_words() return "" end
function family.build(m, s)
  local r = {model = Toy()}
  if s.lora then
    r.model:freeze()
    r.adapter = lora.attach(r.model, s.lora)
  end
  local g = ck.graph()
  r.graph = g
  r.objective = setmetatable({seed = m.seed}, Flow)
  local loss = r.objective:build(g, r.model, s.batch, s.latent[1], s.latent[2])
  r.inputs = r.objective.inputs
  local c = {loss = loss}
  for k, v in pairs(s.compile) do c[k] = v end
  r.program = g:compile(c)
  return r
end
function family.text_shapes() return {{"text_embeds", {T, D}}} end
-- deterministic latents and text per sample, as ck.data's synthetic set is
local function sample(i, o)
  local lat, txt = {}, {}
  for k = 1, C * o.height * o.width do lat[k] = math.sin(0.3 * k + i) + 0.5 * ck.randn(o.seed, 0, 0x5100 + i, k) end
  for k = 1, T * D do txt[k] = 0.5 * ck.randn(o.seed, 1, 0x5100 + i, k) end
  return {latents = {{C, o.height, o.width}, lat}, text_embeds = {{T, D}, txt}}
end
function family.dataset(_, src, o)
  o.image_fields, o.text_fields, o.sample = {"latents"}, {"text_embeds"}, sample
  return data.latents(src, o)
end
function family.settings(m) return {targets = table.concat(m.targets, ",")} end
function family.save_adapter(p, h, path, o)
  p:save(path, lora.entries(h, "peft"), {metadata = o.metadata, dtype = o.dtype})
end

require("ck.train").run(args, {family = family, about = "Train a toy flow-matching denoiser through ck.train."})

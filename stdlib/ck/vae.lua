-- The SDXL VAE (diffusers' AutoencoderKL) as ck graphs: the encoder (image ->
-- latent mean and log-variance) for the latent cache, the decoder (latent ->
-- image) for sampling. Parameter names are diffusers' state_dict keys, so a
-- diffusers vae/diffusion_pytorch_model.safetensors loads by name.
local ck = require "ck"
local nn = require "ck.nn"

local vae = {}

local copy = nn.copy

local function rep(v, n)
  local t = {}
  for i = 1, n do t[i] = v end
  return t
end

-- diffusers' AutoencoderKL defaults, for keys a config.json leaves out
local defaults = {
  _class_name = "AutoencoderKL",
  in_channels = 3,
  out_channels = 3,
  block_out_channels = {64},
  layers_per_block = 1,
  act_fn = "silu",
  latent_channels = 4,
  norm_num_groups = 32,
  sample_size = 32,
  scaling_factor = 0.18215,
  use_quant_conv = true,
  use_post_quant_conv = true,
  mid_block_add_attention = true,
}

local configs = {
  sdxl = {
    _class_name = "AutoencoderKL",
    in_channels = 3,
    out_channels = 3,
    down_block_types = rep("DownEncoderBlock2D", 4),
    up_block_types = rep("UpDecoderBlock2D", 4),
    block_out_channels = {128, 256, 512, 512},
    layers_per_block = 2,
    act_fn = "silu",
    latent_channels = 4,
    norm_num_groups = 32,
    sample_size = 1024,
    scaling_factor = 0.13025,
    force_upcast = true,
    use_quant_conv = true,
    use_post_quant_conv = true,
    mid_block_add_attention = true,
  },
}
-- SDXL's layout (four blocks, so latents are 1/8 of the pixels as the UNet's
-- are) at small widths: about 317k parameters, for tests and CPU pipelines
configs.tiny = copy(configs.sdxl)
do
  local t = configs.tiny
  t.block_out_channels = {16, 32, 32, 32}
  t.layers_per_block = 1
  t.norm_num_groups = 8
  t.sample_size = 64
end

-- FLUX.1's VAE (BFL's AutoEncoderParams; diffusers' FLUX.1 vae/config.json):
-- SDXL's layout with 16 latent channels, no quant convs, and latents stored
-- as (z - shift_factor) * scaling_factor
configs.flux = copy(configs.sdxl)
do
  local t = configs.flux
  t.latent_channels = 16
  t.scaling_factor, t.shift_factor = 0.3611, 0.1159
  t.use_quant_conv, t.use_post_quant_conv = false, false
end
-- FLUX.1's flags at toy size (two blocks: latents 1/2 of the pixels), for tests
configs["flux-tiny"] = copy(configs.flux)
do
  local t = configs["flux-tiny"]
  t.down_block_types = rep("DownEncoderBlock2D", 2)
  t.up_block_types = rep("UpDecoderBlock2D", 2)
  t.block_out_channels = {8, 16}
  t.layers_per_block = 1
  t.norm_num_groups = 4
  t.sample_size = 32
end

local activations = {silu = ck.silu, swish = ck.silu, mish = ck.mish}

-- a JSON null (ck.json_null) or nil reads as nil
local function number_or_nil(v) return type(v) == "number" and v or nil end

-- vae.config("sdxl" | "tiny" | "flux" | "flux-tiny" | table) -> a fresh config table (safe to edit).
-- A table has diffusers' AutoencoderKL config.json keys (as ck.json_decode
-- reads vae/config.json); keys it leaves out take diffusers' defaults, and
-- what ck.vae cannot build (other block types, activations) is refused here.
local function make_config(what)
  local c
  if type(what) == "table" then
    c = copy(what)
    for k, v in pairs(defaults) do
      if c[k] == nil then c[k] = copy(v) end
    end
  else
    local named = configs[what or "sdxl"]
    if not named then
      error("unknown VAE config '" .. tostring(what) .. "' (sdxl, tiny, flux, flux-tiny, or a config table)", 3)
    end
    c = copy(named)
  end
  local boc = c.block_out_channels
  if type(boc) ~= "table" or #boc < 1 then error("VAE config: block_out_channels must be a list of widths", 3) end
  local n = #boc
  c.down_block_types = c.down_block_types or rep("DownEncoderBlock2D", n)
  c.up_block_types = c.up_block_types or rep("UpDecoderBlock2D", n)
  for key, want in pairs{down_block_types = "DownEncoderBlock2D", up_block_types = "UpDecoderBlock2D"} do
    local t = c[key]
    if type(t) ~= "table" or #t ~= n then
      error("VAE config: " .. key .. " must list " .. n .. " blocks (one per block_out_channels entry)", 3)
    end
    for i = 1, n do
      if t[i] ~= want then error("VAE config: " .. key .. "[" .. i .. "] is " .. tostring(t[i]) .. "; only " ..
                                 want .. " is supported", 3) end
    end
  end
  if not activations[c.act_fn] then
    error("VAE config: act_fn '" .. tostring(c.act_fn) .. "' is not one of silu, swish, mish", 3)
  end
  -- JSON may read whole numbers as floats (128.0): keep them as integers
  for _, k in ipairs{"in_channels", "out_channels", "layers_per_block", "latent_channels", "norm_num_groups",
                     "sample_size"} do
    local v = math.tointeger(c[k])
    if not v or v < 1 then error("VAE config: " .. k .. " must be a positive whole number, got " .. tostring(c[k]), 3) end
    c[k] = v
  end
  local groups = c.norm_num_groups
  for i = 1, n do
    boc[i] = math.tointeger(boc[i]) or boc[i]
    if math.type(boc[i]) ~= "integer" or boc[i] < 1 or boc[i] % groups ~= 0 then
      error("VAE config: block_out_channels[" .. i .. "] = " .. tostring(boc[i]) ..
            " is not a positive multiple of norm_num_groups " .. tostring(groups), 3)
    end
  end
  -- the rest by type and range: a value ck.vae would read wrongly is refused
  -- here, not trained or sampled with
  for _, k in ipairs{"scaling_factor", "shift_factor"} do
    local v = c[k]
    if v ~= nil and v ~= ck.json_null and (type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge) then
      error("VAE config: " .. k .. " must be a finite number, got " .. tostring(v), 3)
    end
  end
  c.shift_factor = number_or_nil(c.shift_factor)
  c.scaling_factor = number_or_nil(c.scaling_factor) or defaults.scaling_factor
  if c.scaling_factor <= 0 then error("VAE config: scaling_factor must be above 0, got " .. c.scaling_factor, 3) end
  for _, k in ipairs{"use_quant_conv", "use_post_quant_conv", "mid_block_add_attention", "force_upcast"} do
    local v = c[k]
    if v ~= nil and v ~= ck.json_null and type(v) ~= "boolean" then
      error("VAE config: " .. k .. " must be true or false, got " .. tostring(v), 3)
    end
  end
  if c._class_name ~= nil and c._class_name ~= "AutoencoderKL" then
    error("VAE config: _class_name is " .. tostring(c._class_name) .. "; ck.vae builds AutoencoderKL", 3)
  end
  return c
end

function vae.config(what)
  local c = make_config(what) -- not a tail call: errors name the caller's line
  return c
end

-- the VAE's norms and resnets use eps 1e-6 throughout (diffusers' Encoder/Decoder)
local EPS = 1e-6

---- ResnetBlock2D{in, out, groups, act} without a time embedding

local ResnetBlock2D = nn.class("VAEResnetBlock2D")
vae.ResnetBlock2D = ResnetBlock2D

function ResnetBlock2D:init(o)
  local cin, cout = o[1], o[2] or o[1]
  self.act = o.act or ck.silu
  self.norm1 = self:add("norm1", nn.GroupNorm{o.groups, cin, eps = EPS})
  self.conv1 = self:add("conv1", nn.Conv2d{cin, cout, 3, padding = 1})
  self.norm2 = self:add("norm2", nn.GroupNorm{o.groups, cout, eps = EPS})
  self.conv2 = self:add("conv2", nn.Conv2d{cout, cout, 3, padding = 1})
  if cin ~= cout then self.conv_shortcut = self:add("conv_shortcut", nn.Conv2d{cin, cout, 1}) end
end

-- x [B, Cin, H, W] -> [B, Cout, H, W]
function ResnetBlock2D:updateOutput(g, x)
  local h = self.conv1:forward(g, nn.norm_act(g, self.norm1, x, self.act))
  h = self.conv2:forward(g, nn.norm_act(g, self.norm2, h, self.act))
  if self.conv_shortcut then x = self.conv_shortcut:forward(g, x) end
  return x + h
end

---- the mid block's attention: one head over all H*W positions, with its own
---- group norm and a residual connection (diffusers' Attention as the VAE sets it up)

local SpatialAttention = nn.class("VAESpatialAttention")
vae.SpatialAttention = SpatialAttention

function SpatialAttention:init(o)
  local c = o[1]
  self.group_norm = self:add("group_norm", nn.GroupNorm{o.groups, c, eps = EPS})
  self.to_q = self:add("to_q", nn.Linear{c, c})
  self.to_k = self:add("to_k", nn.Linear{c, c})
  self.to_v = self:add("to_v", nn.Linear{c, c})
  self.to_out = self:add("to_out.0", nn.Linear{c, c})
end

-- x [B, C, H, W] -> [B, C, H, W]; softmax(q k^T / sqrt(C)) v, one head
function SpatialAttention:updateOutput(g, x)
  local s = x.shape
  local b, c, h, w = s[1], s[2], s[3], s[4]
  local t = self.group_norm:forward(g, x)
  t = ck.reshape(ck.permute(ck.reshape(t, {b, c, h * w}), {0, 2, 1}), {b, h * w, c})
  local a = ck.attention(self.to_q:forward(g, t), self.to_k:forward(g, t), self.to_v:forward(g, t), 1)
  local o = self.to_out:forward(g, a)
  return ck.reshape(ck.permute(o, {0, 2, 1}), {b, c, h, w}) + x
end

---- UNetMidBlock2D: resnets.0, then (attentions.0, resnets.1)

local MidBlock = nn.class("VAEMidBlock2D")
vae.MidBlock = MidBlock

function MidBlock:init(o)
  local c = o[1]
  if o.attention ~= false then
    self.attention = self:add("attentions.0", SpatialAttention{c, groups = o.groups})
  end
  self.resnet0 = self:add("resnets.0", ResnetBlock2D{c, c, groups = o.groups, act = o.act})
  self.resnet1 = self:add("resnets.1", ResnetBlock2D{c, c, groups = o.groups, act = o.act})
end

function MidBlock:updateOutput(g, x)
  x = self.resnet0:forward(g, x)
  if self.attention then x = self.attention:forward(g, x) end
  return self.resnet1:forward(g, x)
end

---- Downsample2D with padding 0: one zero row and column appended (bottom and
---- right, torch's F.pad(x, (0, 1, 0, 1))), then a 3x3 conv of stride 2

-- x with one slice of zeros appended along dim. The zeros are x's first slice
-- times 0, so no extra input is needed (an infinite value there becomes NaN)
local function append_zeros(x, dim)
  local z = ck.scale(ck.slice(x, dim, 0, 1), 0)
  return ck.concat(x, z, dim)
end

local Downsample = nn.class("VAEDownsample2D")
vae.Downsample = Downsample

function Downsample:init(o)
  self.conv = self:add("conv", nn.Conv2d{o[1], o[1], 3, stride = 2, padding = 0})
end

function Downsample:updateOutput(g, x)
  return self.conv:forward(g, append_zeros(append_zeros(x, 3), 2))
end

---- Upsample2D: nearest x2, then a 3x3 conv

local Upsample = nn.class("VAEUpsample2D")
vae.Upsample = Upsample

function Upsample:init(o)
  self.conv = self:add("conv", nn.Conv2d{o[1], o[1], 3, padding = 1})
end

function Upsample:updateOutput(g, x) return self.conv:forward(g, ck.upsample2x(x)) end

---- DownEncoderBlock2D / UpDecoderBlock2D: resnets, then an optional resampler

local DownEncoderBlock2D = nn.class("DownEncoderBlock2D")
vae.DownEncoderBlock2D = DownEncoderBlock2D

function DownEncoderBlock2D:init(o)
  self.resnets = {}
  for i = 1, o.layers do
    self.resnets[i] = self:add("resnets." .. (i - 1), ResnetBlock2D{i == 1 and o.in_channels or o.out_channels,
      o.out_channels, groups = o.groups, act = o.act})
  end
  if o.add_downsample then self.downsampler = self:add("downsamplers.0", Downsample{o.out_channels}) end
end

-- the resnets, then the resampler (a downsampler or an upsampler) if the block has one
local function resample_block_forward(self, g, x)
  for _, r in ipairs(self.resnets) do x = r:forward(g, x) end
  local resampler = self.downsampler or self.upsampler
  if resampler then x = resampler:forward(g, x) end
  return x
end

DownEncoderBlock2D.updateOutput = resample_block_forward

local UpDecoderBlock2D = nn.class("UpDecoderBlock2D")
vae.UpDecoderBlock2D = UpDecoderBlock2D

function UpDecoderBlock2D:init(o)
  self.resnets = {}
  for i = 1, o.layers do
    self.resnets[i] = self:add("resnets." .. (i - 1), ResnetBlock2D{i == 1 and o.in_channels or o.out_channels,
      o.out_channels, groups = o.groups, act = o.act})
  end
  if o.add_upsample then self.upsampler = self:add("upsamplers.0", Upsample{o.out_channels}) end
end

UpDecoderBlock2D.updateOutput = resample_block_forward

---- Encoder(config): conv_in, down_blocks, mid_block, conv_norm_out, act, conv_out (2 x latent channels)

local Encoder = nn.class("VAEEncoder")
vae.Encoder = Encoder

function Encoder:init(c)
  local boc, n, groups, act = c.block_out_channels, #c.block_out_channels, c.norm_num_groups, activations[c.act_fn]
  self.act = act
  self.conv_in = self:add("conv_in", nn.Conv2d{c.in_channels, boc[1], 3, padding = 1})
  self.down_blocks = {}
  for i = 1, n do
    self.down_blocks[i] = self:add("down_blocks." .. (i - 1), DownEncoderBlock2D{
      in_channels = boc[math.max(i - 1, 1)], out_channels = boc[i], layers = c.layers_per_block, groups = groups,
      act = act, add_downsample = i < n})
  end
  self.mid_block = self:add("mid_block", MidBlock{boc[n], groups = groups, act = act,
                                                  attention = c.mid_block_add_attention ~= false})
  self.conv_norm_out = self:add("conv_norm_out", nn.GroupNorm{groups, boc[n], eps = EPS})
  self.conv_out = self:add("conv_out", nn.Conv2d{boc[n], 2 * c.latent_channels, 3, padding = 1})
end

function Encoder:updateOutput(g, x)
  x = self.conv_in:forward(g, x)
  for _, blk in ipairs(self.down_blocks) do x = blk:forward(g, x) end
  x = self.mid_block:forward(g, x)
  return self.conv_out:forward(g, nn.norm_act(g, self.conv_norm_out, x, self.act))
end

---- Decoder(config): conv_in, mid_block, up_blocks (layers_per_block + 1 resnets each), conv_norm_out, act, conv_out

local Decoder = nn.class("VAEDecoder")
vae.Decoder = Decoder

function Decoder:init(c)
  local boc, n, groups, act = c.block_out_channels, #c.block_out_channels, c.norm_num_groups, activations[c.act_fn]
  self.act = act
  self.conv_in = self:add("conv_in", nn.Conv2d{c.latent_channels, boc[n], 3, padding = 1})
  self.up_blocks = {}
  for i = 1, n do
    local cin, cout = boc[n - math.max(i - 1, 1) + 1], boc[n - i + 1]
    self.up_blocks[i] = self:add("up_blocks." .. (i - 1), UpDecoderBlock2D{
      in_channels = cin, out_channels = cout, layers = c.layers_per_block + 1, groups = groups, act = act,
      add_upsample = i < n})
  end
  self.mid_block = self:add("mid_block", MidBlock{boc[n], groups = groups, act = act,
                                                  attention = c.mid_block_add_attention ~= false})
  self.conv_norm_out = self:add("conv_norm_out", nn.GroupNorm{groups, boc[1], eps = EPS})
  self.conv_out = self:add("conv_out", nn.Conv2d{boc[1], c.out_channels, 3, padding = 1})
end

function Decoder:updateOutput(g, z)
  local x = self.mid_block:forward(g, self.conv_in:forward(g, z))
  for _, blk in ipairs(self.up_blocks) do x = blk:forward(g, x) end
  return self.conv_out:forward(g, nn.norm_act(g, self.conv_norm_out, x, self.act))
end

---- the two halves of AutoencoderKL, each a root module whose children are
---- named as in diffusers' state_dict

local EncoderPart = nn.class("AutoencoderKLEncoder")
vae.EncoderPart = EncoderPart

function EncoderPart:init(c)
  self.config = c
  self.encoder = self:add("encoder", Encoder(c))
  if c.use_quant_conv ~= false then
    local m = 2 * c.latent_channels
    self.quant_conv = self:add("quant_conv", nn.Conv2d{m, m, 1})
  end
end

-- image [B, in, H, W] -> mean, logvar [B, latent, H/8, W/8]
function EncoderPart:updateOutput(g, x)
  local moments = self.encoder:forward(g, x)
  if self.quant_conv then moments = self.quant_conv:forward(g, moments) end
  local l = self.config.latent_channels
  return ck.slice(moments, 1, 0, l), ck.slice(moments, 1, l, l)
end

local DecoderPart = nn.class("AutoencoderKLDecoder")
vae.DecoderPart = DecoderPart

function DecoderPart:init(c)
  self.config = c
  if c.use_post_quant_conv ~= false then
    self.post_quant_conv = self:add("post_quant_conv", nn.Conv2d{c.latent_channels, c.latent_channels, 1})
  end
  self.decoder = self:add("decoder", Decoder(c))
end

-- latents [B, latent, h, w] (already divided by scaling_factor) -> image [B, out, 8h, 8w]
function DecoderPart:updateOutput(g, z)
  if self.post_quant_conv then z = self.post_quant_conv:forward(g, z) end
  return self.decoder:forward(g, z)
end

local function shape_opts(c, opts, what)
  opts = opts or {}
  local b = opts.batch or 1
  local h = opts.height or c.sample_size
  local w = opts.width or h
  for _, kv in ipairs{{"batch", b}, {"height", h}, {"width", w}} do
    if math.type(kv[2]) ~= "integer" or kv[2] < 1 then
      error(what .. ": " .. kv[1] .. " must be a positive whole number, got " .. tostring(kv[2]), 3)
    end
  end
  return b, h, w, opts.frozen ~= false
end

-- vae.build_encoder(g, config, {batch=1, height=, width= (pixels; default sample_size), frozen=true})
-- -> module, mean, logvar. Declares the input "sample" [B, in_channels, H, W] (pixels in [-1, 1]);
-- mean and logvar are [B, latent_channels, H/8, W/8] (with four blocks). logvar is quant_conv's
-- second half as is: ck has no clamp op, so diffusers' clamp to [-30, 20] is applied by
-- vae.latents, where the log-variance is used. Parameters are frozen unless frozen = false.
function vae.build_encoder(g, config, opts)
  local c = make_config(config)
  local b, h, w, frozen = shape_opts(c, opts, "vae.build_encoder")
  local m = EncoderPart(c)
  if frozen then m:freeze() end
  local x = g:input("sample", {b, c.in_channels, h, w})
  local mean, logvar = m:forward(g, x)
  return m, mean, logvar
end

-- vae.build_decoder(g, config, {batch=1, height=, width= (latent size; default sample_size/8), frozen=true,
--                   unscale=false})
-- -> module, image. Declares the input "latents" [B, latent_channels, h, w], already divided by
-- scaling_factor (diffusers' vae.decode(latents / scaling_factor)); with unscale = true it takes the
-- UNet's latents as they are (what the cache stores) and the graph divides by scaling_factor first
-- (a config with a shift_factor cannot: ck cannot add a constant; give it vae.unscale's values
-- instead). image is [B, out_channels, 8h, 8w] (with four blocks), roughly in [-1, 1].
function vae.build_decoder(g, config, opts)
  local c = make_config(config)
  local down = 1 << (#c.block_out_channels - 1)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.height = o.height or c.sample_size // down
  local b, h, w, frozen = shape_opts(c, o, "vae.build_decoder")
  if o.unscale and c.shift_factor then
    error("vae.build_decoder: unscale = true needs a config without shift_factor (it has " .. c.shift_factor ..
      "); set the latents input to vae.unscale(latents, config)", 2)
  end
  local m = DecoderPart(c)
  if frozen then m:freeze() end
  local z = g:input("latents", {b, c.latent_channels, h, w})
  if o.unscale then z = ck.scale(z, 1 / c.scaling_factor) end
  local image = m:forward(g, z)
  return m, image
end

-- vae.weights(g [, prefix]) -> {name = key}: p:load's map for every VAE parameter of g
-- (encoder.*, quant_conv.*, decoder.*, post_quant_conv.*), each to the same key in a
-- diffusers VAE file, or to prefix .. key (e.g. "vae." for a file that holds a whole pipeline).
-- p:load(ck.safetensors(path), vae.weights(g)) then fails on the first key the file lacks.
function vae.weights(g, prefix)
  local map = {}
  for _, t in ipairs(g:params()) do
    local n = t.name
    if n:match("^encoder%.") or n:match("^decoder%.") or n:match("^quant_conv%.") or n:match("^post_quant_conv%.") then
      map[n] = (prefix or "") .. n
    end
  end
  return map
end

-- vae.latents(mean, logvar, noise [, config]) -> flat list: what the latent cache stores,
-- (mean + exp(0.5 * clamp(logvar, -30, 20)) * noise - shift_factor) * scaling_factor,
-- computed on the host from flat lists (p:get of the encoder's outputs, noise drawn
-- N(0, 1) by the caller); config (a name or table, default "sdxl") gives scaling_factor and
-- shift_factor (none for SDXL). noise = nil gives the mode (the mean) instead of a sample.
-- On the host because ck has no exp op to build it in the graph.
function vae.latents(mean, logvar, noise, config)
  local c = make_config(config or "sdxl")
  local sf, shift = c.scaling_factor, c.shift_factor or 0
  local n = #mean
  if #logvar ~= n or (noise and #noise ~= n) then
    error(string.format("vae.latents: mean has %d values, logvar %d, noise %d", n, #logvar,
                        noise and #noise or n), 2)
  end
  local out = {}
  for i = 1, n do
    local z = mean[i]
    if noise then
      local lv = math.min(math.max(logvar[i], -30), 20)
      z = z + math.exp(0.5 * lv) * noise[i]
    end
    out[i] = (z - shift) * sf
  end
  return out
end

-- vae.unscale(latents, config) -> flat list: what the decoder's "latents" input
-- takes for latents as the cache stores them, z / scaling_factor + shift_factor
-- (diffusers' vae.decode(latents / scaling_factor + shift_factor), BFL's
-- AutoEncoder.decode), on the host in double: the inverse of vae.latents'
-- scaling. config: a name or table (default "sdxl").
function vae.unscale(latents, config)
  local c = make_config(config or "sdxl")
  local sf, shift = c.scaling_factor, c.shift_factor or 0
  local out = {}
  for i = 1, #latents do out[i] = latents[i] / sf + shift end
  return out
end

return vae

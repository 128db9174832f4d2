-- The SDXL UNet (diffusers' UNet2DConditionModel) as a tree of ck.nn modules,
-- built from a table with diffusers' config.json keys; parameter names are the
-- diffusers keys, so checkpoints and LoRA files line up by name.
local ck = require "ck"
local nn = require "ck.nn"

local unet = {}

local copy = nn.copy

local configs = {
  sdxl = {
    _class_name = "UNet2DConditionModel",
    sample_size = 128,
    in_channels = 4,
    out_channels = 4,
    flip_sin_to_cos = true,
    freq_shift = 0,
    down_block_types = {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"},
    mid_block_type = "UNetMidBlock2DCrossAttn",
    up_block_types = {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"},
    block_out_channels = {320, 640, 1280},
    layers_per_block = 2,
    downsample_padding = 1,
    act_fn = "silu",
    norm_num_groups = 32,
    norm_eps = 1e-5,
    cross_attention_dim = 2048,
    transformer_layers_per_block = {1, 2, 10},
    attention_head_dim = {5, 10, 20},
    use_linear_projection = true,
    addition_embed_type = "text_time",
    addition_time_embed_dim = 256,
    projection_class_embeddings_input_dim = 2816,
  },
}
configs["sdxl-tiny"] = copy(configs.sdxl)
do
  local t = configs["sdxl-tiny"]
  t.sample_size = 32
  t.block_out_channels = {32, 64, 128}
  t.transformer_layers_per_block = {1, 1, 2}
  t.attention_head_dim = {1, 2, 4}
  t.cross_attention_dim = 64
  t.addition_time_embed_dim = 32
  t.projection_class_embeddings_input_dim = 256
end

-- SDXL's layout at half its widths and fewer transformer layers: about a
-- tenth of its parameters (1 GiB in fp32), large enough that a second copy
-- of the weights shows in a process's memory, small enough to train on a CPU
configs["sdxl-mid"] = copy(configs.sdxl)
do
  local t = configs["sdxl-mid"]
  t.block_out_channels = {160, 320, 640}
  t.transformer_layers_per_block = {1, 2, 4}
  t.cross_attention_dim = 1024
end

-- unet.config("sdxl" | "sdxl-mid" | "sdxl-tiny") -> a fresh config table (safe to edit)
function unet.config(name)
  local c = configs[name or "sdxl"]
  if not c then error("unknown UNet config '" .. tostring(name) .. "' (sdxl, sdxl-mid, sdxl-tiny)", 2) end
  return copy(c)
end

-- a per-block list from a number or a list of nblocks entries
local function per_block(v, n, what)
  if type(v) == "number" then
    local t = {}
    for i = 1, n do t[i] = v end
    return t
  end
  assert(type(v) == "table" and #v == n, what .. " must be a number or a list of " .. n)
  return v
end

local function reversed(t)
  local r = {}
  for i = #t, 1, -1 do r[#r + 1] = t[i] end
  return r
end

---- ResnetBlock2D{in, out, temb, groups=32, eps=1e-5}

local ResnetBlock2D = nn.class("ResnetBlock2D")
unet.ResnetBlock2D = ResnetBlock2D

function ResnetBlock2D:init(o)
  local cin, cout = o[1] or o.in_channels, o[2] or o.out_channels or o[1] or o.in_channels
  local groups, eps = o.groups or 32, o.eps or 1e-5
  self.norm1 = self:add("norm1", nn.GroupNorm{groups, cin, eps = eps})
  self.conv1 = self:add("conv1", nn.Conv2d{cin, cout, 3, padding = 1})
  self.time_emb_proj = self:add("time_emb_proj", nn.Linear{o.temb or o[3], cout})
  self.norm2 = self:add("norm2", nn.GroupNorm{groups, cout, eps = eps})
  self.conv2 = self:add("conv2", nn.Conv2d{cout, cout, 3, padding = 1})
  if cin ~= cout then self.conv_shortcut = self:add("conv_shortcut", nn.Conv2d{cin, cout, 1}) end
end

-- x [B, Cin, H, W], temb [B, T] -> [B, Cout, H, W]
function ResnetBlock2D:updateOutput(g, x, temb)
  local h = self.conv1:forward(g, nn.norm_act(g, self.norm1, x))
  local t = self.time_emb_proj:forward(g, ck.silu(temb))
  local ts = t.shape
  h = h + ck.reshape(t, {ts[1], ts[2], 1, 1})
  h = nn.norm_act(g, self.norm2, h)
  if (self.dropout or 0) > 0 then h = ck.dropout(h, self.dropout) end
  h = self.conv2:forward(g, h)
  if self.conv_shortcut then x = self.conv_shortcut:forward(g, x) end
  return x + h
end

---- BasicTransformerBlock{dim, heads, dim_head, cross_attention_dim}

local BasicTransformerBlock = nn.class("BasicTransformerBlock")
unet.BasicTransformerBlock = BasicTransformerBlock

function BasicTransformerBlock:init(o)
  local dim = o[1] or o.dim
  self.norm1 = self:add("norm1", nn.LayerNorm{dim, eps = 1e-5})
  self.attn1 = self:add("attn1", nn.Attention{query_dim = dim, heads = o.heads, dim_head = o.dim_head})
  self.norm2 = self:add("norm2", nn.LayerNorm{dim, eps = 1e-5})
  self.attn2 = self:add("attn2", nn.Attention{query_dim = dim, cross_attention_dim = o.cross_attention_dim,
                                              heads = o.heads, dim_head = o.dim_head})
  self.norm3 = self:add("norm3", nn.LayerNorm{dim, eps = 1e-5})
  self.ff = self:add("ff", nn.FeedForward{dim})
end

-- x [B, L, C], context [B, S, cross_attention_dim]
function BasicTransformerBlock:updateOutput(g, x, context)
  x = self.attn1:forward(g, self.norm1:forward(g, x)) + x
  x = self.attn2:forward(g, self.norm2:forward(g, x), context) + x
  return self.ff:forward(g, self.norm3:forward(g, x)) + x
end

---- Transformer2DModel{in_channels, heads, dim_head, layers, cross_attention_dim, groups, use_linear_projection}

local Transformer2DModel = nn.class("Transformer2DModel")
unet.Transformer2DModel = Transformer2DModel

function Transformer2DModel:init(o)
  local c = o[1] or o.in_channels
  local inner = o.heads * o.dim_head
  self.linear = o.use_linear_projection ~= false
  self.norm = self:add("norm", nn.GroupNorm{o.groups or 32, c, eps = 1e-6})
  self.proj_in = self:add("proj_in", self.linear and nn.Linear{c, inner} or nn.Conv2d{c, inner, 1})
  self.blocks = {}
  for i = 1, o.layers or 1 do
    self.blocks[i] = self:add("transformer_blocks." .. (i - 1), BasicTransformerBlock{
      inner, heads = o.heads, dim_head = o.dim_head, cross_attention_dim = o.cross_attention_dim})
  end
  self.proj_out = self:add("proj_out", self.linear and nn.Linear{inner, c} or nn.Conv2d{inner, c, 1})
end

local function to_tokens(x)
  local s = x.shape
  return ck.reshape(ck.permute(x, {0, 2, 3, 1}), {s[1], s[3] * s[4], s[2]})
end

local function to_image(x, b, h, w)
  local c = x.shape[3]
  return ck.permute(ck.reshape(x, {b, h, w, c}), {0, 3, 1, 2})
end

-- x [B, C, H, W], context [B, S, cross_attention_dim] -> [B, C, H, W]
function Transformer2DModel:updateOutput(g, x, context)
  local s = x.shape
  local h = self.norm:forward(g, x)
  if self.linear then
    h = self.proj_in:forward(g, to_tokens(h))
  else
    h = to_tokens(self.proj_in:forward(g, h))
  end
  for _, blk in ipairs(self.blocks) do h = blk:forward(g, h, context) end
  if self.linear then
    h = to_image(self.proj_out:forward(g, h), s[1], s[3], s[4])
  else
    h = self.proj_out:forward(g, to_image(h, s[1], s[3], s[4]))
  end
  return h + x
end

---- Downsample2D{channels, out, padding=1}: 3x3 conv, stride 2

local Downsample2D = nn.class("Downsample2D")
unet.Downsample2D = Downsample2D

function Downsample2D:init(o)
  local c = o[1] or o.channels
  self.conv = self:add("conv", nn.Conv2d{c, o[2] or o.out_channels or c, 3, stride = 2, padding = o.padding or 1})
end

function Downsample2D:updateOutput(g, x) return self.conv:forward(g, x) end

---- Upsample2D{channels, out}: nearest x2, then a 3x3 conv

local Upsample2D = nn.class("Upsample2D")
unet.Upsample2D = Upsample2D

function Upsample2D:init(o)
  local c = o[1] or o.channels
  self.conv = self:add("conv", nn.Conv2d{c, o[2] or o.out_channels or c, 3, padding = 1})
end

function Upsample2D:updateOutput(g, x) return self.conv:forward(g, ck.upsample2x(x)) end

---- Down blocks: resnets (and attentions) then an optional downsampler; forward
---- returns the output and the list of skip states, as diffusers.

-- o: in, out, temb, layers, groups, eps, add_downsample, downsample_padding, and for
-- cross attention: transformer_layers, heads, cross_attention_dim, use_linear_projection
local function down_block(self, o, cross)
  self.resnets, self.attentions = {}, {}
  for i = 1, o.layers do
    local cin = i == 1 and o.in_channels or o.out_channels
    self.resnets[i] = ResnetBlock2D{cin, o.out_channels, temb = o.temb, groups = o.groups, eps = o.eps}
  end
  if cross then
    for i = 1, o.layers do
      self.attentions[i] = Transformer2DModel{o.out_channels, heads = o.heads, dim_head = o.out_channels // o.heads,
        layers = o.transformer_layers, cross_attention_dim = o.cross_attention_dim, groups = o.groups,
        use_linear_projection = o.use_linear_projection}
    end
  end
  -- diffusers registers attentions before resnets
  for i, a in ipairs(self.attentions) do self:add("attentions." .. (i - 1), a) end
  for i, r in ipairs(self.resnets) do self:add("resnets." .. (i - 1), r) end
  if o.add_downsample then
    self.downsampler = self:add("downsamplers.0", Downsample2D{o.out_channels, padding = o.downsample_padding or 1})
  end
end

local function down_forward(self, g, x, temb, context)
  local states = {}
  for i, r in ipairs(self.resnets) do
    x = r:forward(g, x, temb)
    if self.attentions[i] then x = self.attentions[i]:forward(g, x, context) end
    states[#states + 1] = x
  end
  if self.downsampler then
    x = self.downsampler:forward(g, x)
    states[#states + 1] = x
  end
  return x, states
end

local DownBlock2D = nn.class("DownBlock2D")
unet.DownBlock2D = DownBlock2D
function DownBlock2D:init(o) down_block(self, o, false) end
DownBlock2D.updateOutput = down_forward

local CrossAttnDownBlock2D = nn.class("CrossAttnDownBlock2D")
unet.CrossAttnDownBlock2D = CrossAttnDownBlock2D
function CrossAttnDownBlock2D:init(o) down_block(self, o, true) end
CrossAttnDownBlock2D.updateOutput = down_forward

---- UNetMidBlock2DCrossAttn: resnets.0, then (attentions.i, resnets.i+1) pairs

local UNetMidBlock2DCrossAttn = nn.class("UNetMidBlock2DCrossAttn")
unet.UNetMidBlock2DCrossAttn = UNetMidBlock2DCrossAttn

function UNetMidBlock2DCrossAttn:init(o)
  local c = o.in_channels
  self.attentions, self.resnets = {}, {}
  local n = o.layers or 1
  for i = 1, n do
    self.attentions[i] = self:add("attentions." .. (i - 1), Transformer2DModel{c, heads = o.heads,
      dim_head = c // o.heads, layers = o.transformer_layers, cross_attention_dim = o.cross_attention_dim,
      groups = o.groups, use_linear_projection = o.use_linear_projection})
  end
  for i = 1, n + 1 do
    self.resnets[i] = self:add("resnets." .. (i - 1), ResnetBlock2D{c, c, temb = o.temb, groups = o.groups, eps = o.eps})
  end
end

function UNetMidBlock2DCrossAttn:updateOutput(g, x, temb, context)
  x = self.resnets[1]:forward(g, x, temb)
  for i, a in ipairs(self.attentions) do
    x = self.resnets[i + 1]:forward(g, a:forward(g, x, context), temb)
  end
  return x
end

---- Up blocks: each resnet takes the current sample concatenated on channels
---- with the latest skip state; then an optional upsampler.

-- o: in (channels of the skip from the level below), prev_out, out, temb, layers,
-- add_upsample, and the cross attention keys as down_block
local function up_block(self, o, cross)
  self.resnets, self.attentions = {}, {}
  for i = 1, o.layers do
    local skip = i == o.layers and o.in_channels or o.out_channels
    local cin = i == 1 and o.prev_output_channels or o.out_channels
    self.resnets[i] = ResnetBlock2D{cin + skip, o.out_channels, temb = o.temb, groups = o.groups, eps = o.eps}
  end
  if cross then
    for i = 1, o.layers do
      self.attentions[i] = Transformer2DModel{o.out_channels, heads = o.heads, dim_head = o.out_channels // o.heads,
        layers = o.transformer_layers, cross_attention_dim = o.cross_attention_dim, groups = o.groups,
        use_linear_projection = o.use_linear_projection}
    end
  end
  for i, a in ipairs(self.attentions) do self:add("attentions." .. (i - 1), a) end
  for i, r in ipairs(self.resnets) do self:add("resnets." .. (i - 1), r) end
  if o.add_upsample then self.upsampler = self:add("upsamplers.0", Upsample2D{o.out_channels}) end
end

-- skips: the whole skip stack; this block pops one per resnet from the end
local function up_forward(self, g, x, skips, temb, context)
  for i, r in ipairs(self.resnets) do
    local s = table.remove(skips)
    x = r:forward(g, ck.concat(x, s, 1), temb)
    if self.attentions[i] then x = self.attentions[i]:forward(g, x, context) end
  end
  if self.upsampler then x = self.upsampler:forward(g, x) end
  return x
end

local UpBlock2D = nn.class("UpBlock2D")
unet.UpBlock2D = UpBlock2D
function UpBlock2D:init(o) up_block(self, o, false) end
UpBlock2D.updateOutput = up_forward

local CrossAttnUpBlock2D = nn.class("CrossAttnUpBlock2D")
unet.CrossAttnUpBlock2D = CrossAttnUpBlock2D
function CrossAttnUpBlock2D:init(o) up_block(self, o, true) end
CrossAttnUpBlock2D.updateOutput = up_forward

local down_types = {DownBlock2D = DownBlock2D, CrossAttnDownBlock2D = CrossAttnDownBlock2D}
local up_types = {UpBlock2D = UpBlock2D, CrossAttnUpBlock2D = CrossAttnUpBlock2D}

---- UNet2DConditionModel(config)

-- unet.check_config(c) -> nil, or what is wrong with config c ("key 'X' ...",
-- one line): every key ck.unet reads, by type, sign and range, so that a
-- value it would read wrongly ([1, -3, 1] transformer layers: a model without
-- those blocks) is refused instead of built. Whole numbers may be floats (JSON).
local function whole(v, lo) return type(v) == "number" and math.tointeger(v) ~= nil and v >= lo end
local function finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end

function unet.check_config(c)
  if type(c) ~= "table" then return "the config is a " .. type(c) .. ", not a table" end
  local function shown(v) return type(v) == "table" and ck.json_encode(v) or tostring(v) end
  local boc = c.block_out_channels
  if type(boc) ~= "table" or #boc < 1 then return "key 'block_out_channels' must be a list of widths" end
  local n = #boc
  for i = 1, n do
    if not whole(boc[i], 1) then return "key 'block_out_channels' entry " .. i .. " is " .. shown(boc[i]) .. ", not a width >= 1" end
  end
  for _, k in ipairs{"down_block_types", "up_block_types"} do
    if type(c[k]) ~= "table" or #c[k] ~= n then return "key '" .. k .. "' must list " .. n .. " blocks, as block_out_channels" end
  end
  for _, k in ipairs{"in_channels", "out_channels", "cross_attention_dim"} do
    if not whole(c[k], 1) then return "key '" .. k .. "' must be a whole number >= 1, got " .. shown(c[k]) end
  end
  local optional = {sample_size = 1, norm_num_groups = 1, downsample_padding = 0}
  if c.addition_embed_type == "text_time" then
    optional.addition_time_embed_dim, optional.projection_class_embeddings_input_dim = 1, 1
    for _, k in ipairs{"addition_time_embed_dim", "projection_class_embeddings_input_dim"} do
      if c[k] == nil then return "key '" .. k .. "' is needed by addition_embed_type text_time" end
    end
  end
  for k, lo in pairs(optional) do
    if c[k] ~= nil and not whole(c[k], lo) then return "key '" .. k .. "' must be a whole number >= " .. lo .. ", got " .. shown(c[k]) end
  end
  if c.addition_embed_type == "text_time" and
     c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim < 1 then
    return "key 'projection_class_embeddings_input_dim' " .. shown(c.projection_class_embeddings_input_dim) ..
      " leaves no pooled text embedding beside 6 time ids of addition_time_embed_dim " .. shown(c.addition_time_embed_dim)
  end
  -- per-block keys: a whole number >= 1, or a list of one per block
  local lists = {}
  for _, k in ipairs{"layers_per_block", "transformer_layers_per_block", "attention_head_dim", "num_attention_heads"} do
    local v = c[k]
    if v ~= nil then
      if type(v) == "table" then
        if #v ~= n then return "key '" .. k .. "' must be a number or a list of " .. n .. ", got " .. shown(v) end
        for i = 1, n do
          if not whole(v[i], 1) then
            return "key '" .. k .. "' entry " .. i .. " is " .. shown(v[i]) .. ", not a whole number >= 1 (in " .. shown(v) .. ")"
          end
        end
        lists[k] = v
      elseif not whole(v, 1) then
        return "key '" .. k .. "' must be a whole number >= 1 or a list of them, got " .. shown(v)
      else
        local t = {}
        for i = 1, n do t[i] = v end
        lists[k] = t
      end
    end
  end
  local groups = c.norm_num_groups or 32
  local heads = lists.num_attention_heads or lists.attention_head_dim
  for i = 1, n do
    if boc[i] % groups ~= 0 then
      return "key 'block_out_channels' entry " .. i .. " (" .. boc[i] .. ") is not a multiple of norm_num_groups " .. groups
    end
    if heads and boc[i] % heads[i] ~= 0 then
      return "key 'block_out_channels' entry " .. i .. " (" .. boc[i] .. ") is not a multiple of its " .. heads[i] ..
        " attention heads"
    end
  end
  if c.norm_eps ~= nil and not (finite(c.norm_eps) and c.norm_eps > 0) then
    return "key 'norm_eps' must be a number above 0, got " .. shown(c.norm_eps)
  end
  if c.freq_shift ~= nil and not finite(c.freq_shift) then return "key 'freq_shift' must be a finite number, got " .. shown(c.freq_shift) end
  if c.dropout ~= nil and not (finite(c.dropout) and c.dropout >= 0 and c.dropout < 1) then
    return "key 'dropout' must be a number in [0, 1), got " .. shown(c.dropout)
  end
  for _, k in ipairs{"flip_sin_to_cos", "use_linear_projection"} do
    if c[k] ~= nil and type(c[k]) ~= "boolean" then return "key '" .. k .. "' must be true or false, got " .. shown(c[k]) end
  end
  return nil
end

local UNet2DConditionModel = nn.class("UNet2DConditionModel")
unet.UNet2DConditionModel = UNet2DConditionModel

function UNet2DConditionModel:init(config)
  if type(config) == "string" then config = unet.config(config) end
  local c = copy(assert(config, "UNet2DConditionModel: config"))
  local why = unet.check_config(c)
  if why then error("UNet2DConditionModel: " .. why, 3) end
  self.config = c
  local boc = c.block_out_channels
  local n = #boc
  assert(#c.down_block_types == n and #c.up_block_types == n, "block types and block_out_channels differ in length")
  local groups, eps = c.norm_num_groups or 32, c.norm_eps or 1e-5
  local layers = per_block(c.layers_per_block or 2, n, "layers_per_block")
  local tlayers = per_block(c.transformer_layers_per_block or 1, n, "transformer_layers_per_block")
  local heads = per_block(c.num_attention_heads or c.attention_head_dim or 8, n, "attention_head_dim")
  local cross = c.cross_attention_dim
  local linear = c.use_linear_projection == true
  local temb = boc[1] * 4
  assert(c.mid_block_type == nil or c.mid_block_type == "UNetMidBlock2DCrossAttn",
    "mid_block_type " .. tostring(c.mid_block_type) .. " is not supported")
  assert(c.act_fn == nil or c.act_fn == "silu", "act_fn must be silu")

  self.conv_in = self:add("conv_in", nn.Conv2d{c.in_channels, boc[1], 3, padding = 1})
  self.time_proj = self:add("time_proj", nn.Timesteps{boc[1], flip_sin_to_cos = c.flip_sin_to_cos ~= false,
                                                      downscale_freq_shift = c.freq_shift or 0})
  self.time_embedding = self:add("time_embedding", nn.TimestepEmbedding{boc[1], temb})
  if c.addition_embed_type == "text_time" then
    self.add_time_proj = self:add("add_time_proj", nn.Timesteps{c.addition_time_embed_dim,
      flip_sin_to_cos = c.flip_sin_to_cos ~= false, downscale_freq_shift = c.freq_shift or 0})
    self.add_embedding = self:add("add_embedding", nn.TimestepEmbedding{c.projection_class_embeddings_input_dim, temb})
  elseif c.addition_embed_type ~= nil then
    error("addition_embed_type " .. tostring(c.addition_embed_type) .. " is not supported")
  end

  local down, up = {}, {}
  local out = boc[1]
  for i = 1, n do
    local cls = down_types[c.down_block_types[i]] or error("unknown down block " .. tostring(c.down_block_types[i]))
    local cin = out
    out = boc[i]
    down[i] = cls{in_channels = cin, out_channels = out, temb = temb, layers = layers[i], groups = groups, eps = eps,
      add_downsample = i < n, downsample_padding = c.downsample_padding, transformer_layers = tlayers[i],
      heads = heads[i], cross_attention_dim = cross, use_linear_projection = linear}
  end
  local mid = UNetMidBlock2DCrossAttn{in_channels = boc[n], temb = temb, groups = groups, eps = eps,
    transformer_layers = tlayers[n], heads = heads[n], cross_attention_dim = cross, use_linear_projection = linear}
  local rboc, rlayers, rtlayers, rheads = reversed(boc), reversed(layers), reversed(tlayers), reversed(heads)
  out = rboc[1]
  for i = 1, n do
    local cls = up_types[c.up_block_types[i]] or error("unknown up block " .. tostring(c.up_block_types[i]))
    local prev = out
    out = rboc[i]
    up[i] = cls{in_channels = rboc[math.min(i + 1, n)], prev_output_channels = prev, out_channels = out, temb = temb,
      layers = rlayers[i] + 1, groups = groups, eps = eps, add_upsample = i < n, transformer_layers = rtlayers[i],
      heads = rheads[i], cross_attention_dim = cross, use_linear_projection = linear}
  end
  -- registration order follows diffusers (down, up, mid), so a walk of the tree
  -- visits modules in state_dict order; forward runs down, mid, up.
  self.down_blocks, self.up_blocks = {}, {}
  for i = 1, n do self.down_blocks[i] = self:add("down_blocks." .. (i - 1), down[i]) end
  for i = 1, n do self.up_blocks[i] = self:add("up_blocks." .. (i - 1), up[i]) end
  self.mid_block = self:add("mid_block", mid)
  self.conv_norm_out = self:add("conv_norm_out", nn.GroupNorm{groups, boc[1], eps = eps})
  self.conv_act = self:add("conv_act", nn.SiLU{})
  self.conv_out = self:add("conv_out", nn.Conv2d{boc[1], c.out_channels, 3, padding = 1})
  -- config.dropout (diffusers' resnet dropout; here also attention to_out.1 and ff net.1)
  if (c.dropout or 0) > 0 then
    for _, e in ipairs(self:named_modules()) do
      local m = e[2]
      local mt = getmetatable(m)
      if mt == ResnetBlock2D or mt == nn.Attention or mt == nn.FeedForward then m.dropout = c.dropout end
    end
  end
end

-- sample [B, in, H, W], timesteps [B], encoder_hidden_states [B, S, cross_attention_dim],
-- text_embeds [B, pooled], time_ids [B, 6] -> [B, out, H, W]
function UNet2DConditionModel:updateOutput(g, sample, timesteps, encoder_hidden_states, text_embeds, time_ids)
  local b = sample.shape[1]
  local emb = self.time_embedding:forward(g, self.time_proj:forward(g, timesteps))
  if self.add_embedding then
    assert(text_embeds and time_ids, "SDXL conditioning needs text_embeds and time_ids")
    local te = self.add_time_proj:forward(g, ck.reshape(time_ids, {-1}))
    local add = ck.concat(text_embeds, ck.reshape(te, {b, -1}), -1)
    emb = emb + self.add_embedding:forward(g, add)
  end
  local x = self.conv_in:forward(g, sample)
  local skips = {x}
  for _, blk in ipairs(self.down_blocks) do
    local states
    x, states = blk:forward(g, x, emb, encoder_hidden_states)
    for _, s in ipairs(states) do skips[#skips + 1] = s end
  end
  x = self.mid_block:forward(g, x, emb, encoder_hidden_states)
  for _, blk in ipairs(self.up_blocks) do x = blk:forward(g, x, skips, emb, encoder_hidden_states) end
  x = nn.norm_act(g, self.conv_norm_out, x, self.conv_act)
  return self.conv_out:forward(g, x)
end

-- Declares the UNet's inputs (outside any scope): opts batch=1, height, width
-- (default sample_size), tokens=77. Returns {sample=, timesteps=, ...}.
function unet.inputs(g, config, opts)
  opts = opts or {}
  if type(config) == "string" then config = unet.config(config) end
  local b = opts.batch or 1
  local h = opts.height or config.sample_size or 128
  local w = opts.width or h
  local t = {
    sample = g:input("sample", {b, config.in_channels, h, w}),
    timesteps = g:input("timesteps", {b}),
    encoder_hidden_states = g:input("encoder_hidden_states", {b, opts.tokens or 77, config.cross_attention_dim}),
  }
  if config.addition_embed_type == "text_time" then
    local pooled = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
    t.text_embeds = g:input("text_embeds", {b, pooled})
    t.time_ids = g:input("time_ids", {b, 6})
  end
  return t
end

-- unet.build(g, model | config | name, {batch=, height=, width=, tokens=, frozen=})
-- -> model, output [B, out, H, W], inputs table
function unet.build(g, what, opts)
  opts = opts or {}
  local model
  if type(what) == "table" and getmetatable(what) and what.forward then
    model = what
  else
    model = UNet2DConditionModel(type(what) == "table" and what or unet.config(what or "sdxl"))
  end
  if opts.frozen then model:freeze() end
  local x = unet.inputs(g, model.config, opts)
  local y = model:forward(g, x.sample, x.timesteps, x.encoder_hidden_states, x.text_embeds, x.time_ids)
  return model, y, x
end

return unet

-- Flux.1's transformer (diffusers' FluxTransformer2DModel) as a tree of ck.nn
-- modules with diffusers' parameter names, its configs (dev, schnell, a tiny
-- one for tests), the latents' 2x2 packing, the tokens' rope table, and the
-- compiled training step. Weights in the files users have map onto these
-- names through ck.flux_keys.
local ck = require "ck"
local nn = require "ck.nn"

local flux = {}

local copy = nn.copy

local configs = {
  ["flux-dev"] = {
    _class_name = "FluxTransformer2DModel",
    patch_size = 1,
    in_channels = 64,
    num_layers = 19,
    num_single_layers = 38,
    attention_head_dim = 128,
    num_attention_heads = 24,
    joint_attention_dim = 4096,
    pooled_projection_dim = 768,
    guidance_embeds = true,
    axes_dims_rope = {16, 56, 56},
  },
}
-- schnell is dev's layout without the guidance embedder
configs["flux-schnell"] = copy(configs["flux-dev"])
configs["flux-schnell"].guidance_embeds = false
-- dev's layout at toy widths (2 double and 2 single blocks, 2 heads of 16):
-- 134,784 parameters, for tests and CPU runs; packed latents keep dev's 64
-- channels (16 latent channels), so the Flux VAE's latents fit it
configs["flux-tiny"] = copy(configs["flux-dev"])
do
  local t = configs["flux-tiny"]
  t.num_layers, t.num_single_layers = 2, 2
  t.attention_head_dim, t.num_attention_heads = 16, 2
  t.joint_attention_dim, t.pooled_projection_dim = 32, 16
  t.axes_dims_rope = {4, 6, 6}
end

-- the sinusoidal embedding's width (BFL's timestep_embedding(t, 256), diffusers' Timesteps(256))
flux.TIME_CHANNELS = 256
-- the norms' eps (LayerNorm without affine, the q/k RMSNorms)
local EPS = 1e-6
-- rope's theta (BFL's EmbedND, diffusers' FluxPosEmbed)
flux.THETA = 10000
-- added to the attention logits at a masked key (the CPU's exp clamps at
-- -87: softmax leaves about 1e-38 there, which the 0/1 keep then zeroes)
flux.MASKED = -1e30
-- the scopes of the blocks, for g:compile{checkpoint = policy.blocks(flux.BLOCKS)}
flux.BLOCKS = {"transformer_blocks.*", "single_transformer_blocks.*"}
-- diffusers' train_dreambooth_lora_flux.py targets (every matching Linear: the
-- double blocks' attention and feed-forwards, the single blocks' q, k and v)
flux.LORA_TARGETS = {"attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj", "attn.add_q_proj",
                     "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                     "ff_context.net.2"}

---- configs

local function whole(v, lo) return math.type(math.tointeger(v)) == "integer" and v >= lo end

-- the keys of a diffusers transformer/config.json that ck.flux reads; keys
-- starting with "_" (but _class_name) are bookkeeping
local KNOWN = {
  patch_size = true, in_channels = true, out_channels = true, num_layers = true, num_single_layers = true,
  attention_head_dim = true, num_attention_heads = true, joint_attention_dim = true,
  pooled_projection_dim = true, guidance_embeds = true, axes_dims_rope = true, _class_name = true,
}

-- flux.check_config(c) -> nil, or what is wrong with config c (one line,
-- "key 'X' ..."): every key ck.flux reads by type, sign and range, and the
-- rope axes summing to the head dim
function flux.check_config(c)
  if type(c) ~= "table" then return "the config is a " .. type(c) .. ", not a table" end
  local function shown(v) return type(v) == "table" and ck.json_encode(v) or tostring(v) end
  for k in pairs(c) do
    if type(k) ~= "string" then return "a key is a " .. type(k) .. ", not a name" end
    if not KNOWN[k] and k:sub(1, 1) ~= "_" then return "key '" .. k .. "' is not one ck.flux builds from" end
  end
  if c._class_name ~= nil and c._class_name ~= "FluxTransformer2DModel" then
    return "key '_class_name' is " .. shown(c._class_name) .. "; ck.flux builds FluxTransformer2DModel"
  end
  for _, k in ipairs{"in_channels", "attention_head_dim", "num_attention_heads", "joint_attention_dim",
                     "pooled_projection_dim"} do
    if not whole(c[k], 1) then return "key '" .. k .. "' must be a whole number >= 1, got " .. shown(c[k]) end
  end
  for _, k in ipairs{"num_layers", "num_single_layers"} do
    if not whole(c[k], 0) then return "key '" .. k .. "' must be a whole number >= 0, got " .. shown(c[k]) end
  end
  if c.num_layers + c.num_single_layers < 1 then return "keys 'num_layers' and 'num_single_layers' give no blocks" end
  local oc = c.out_channels
  if oc ~= nil and oc ~= ck.json_null and not whole(oc, 1) then
    return "key 'out_channels' must be a whole number >= 1 or null, got " .. shown(oc)
  end
  if c.patch_size ~= nil and c.patch_size ~= 1 then
    return "key 'patch_size' is " .. shown(c.patch_size) .. "; Flux.1 packs 2x2 outside the model (patch_size 1)"
  end
  if type(c.guidance_embeds) ~= "boolean" then
    return "key 'guidance_embeds' must be true or false, got " .. shown(c.guidance_embeds)
  end
  if c.attention_head_dim % 2 ~= 0 then return "key 'attention_head_dim' must be even (rope turns pairs), got " .. c.attention_head_dim end
  local axes = c.axes_dims_rope
  if type(axes) ~= "table" or #axes < 1 then return "key 'axes_dims_rope' must be a list of widths, got " .. shown(axes) end
  local sum = 0
  for i, d in ipairs(axes) do
    if not whole(d, 2) or d % 2 ~= 0 then
      return "key 'axes_dims_rope' entry " .. i .. " is " .. shown(d) .. ", not an even width >= 2"
    end
    sum = sum + d
  end
  if sum ~= c.attention_head_dim then
    return "key 'axes_dims_rope' " .. shown(axes) .. " sums to " .. sum .. ", not attention_head_dim " .. c.attention_head_dim
  end
  return nil
end

-- flux.config("flux-dev" | "flux-schnell" | "flux-tiny" | table) -> a fresh
-- config (safe to edit). A table has diffusers' config.json keys (JSON
-- whole numbers as integers; out_channels null or left out: in_channels;
-- axes_dims_rope left out: (16, 56, 56), diffusers' default); what ck.flux
-- cannot build is refused in one line naming the key.
function flux.config(what)
  local c
  if type(what) == "table" then
    c = {}
    for k, v in pairs(what) do if v ~= ck.json_null then c[k] = copy(v) end end
    if c.axes_dims_rope == nil then c.axes_dims_rope = {16, 56, 56} end
    if c.patch_size == nil then c.patch_size = 1 end
    if c.guidance_embeds == nil then c.guidance_embeds = false end
  else
    local named = configs[what or "flux-dev"]
    if not named then
      error("unknown Flux config '" .. tostring(what) .. "' (flux-dev, flux-schnell, flux-tiny, or a config table)", 2)
    end
    c = copy(named)
  end
  local why = flux.check_config(c)
  if why then error("Flux config: " .. why, 2) end
  for k, v in pairs(c) do
    if math.type(v) == "float" and math.tointeger(v) then c[k] = math.tointeger(v) end
  end
  for i, d in ipairs(c.axes_dims_rope) do c.axes_dims_rope[i] = math.tointeger(d) end
  c.out_channels = c.out_channels or c.in_channels
  return c
end

-- the transformer's width (num_attention_heads * attention_head_dim)
function flux.inner_dim(c) return c.num_attention_heads * c.attention_head_dim end

---- modules

-- AdaLayerNormZero (n = 6: the double blocks' norm1 and norm1_context) and
-- AdaLayerNormZeroSingle (n = 3): linear(silu(temb)) cut into n chunks of
-- the width, in diffusers' (and BFL's Modulation's) order: shift, scale,
-- gate (then shift, scale, gate of the MLP); the LayerNorm has no affine.
-- silu(temb) comes in already made: every block shares that one op.
local AdaLayerNormZero = nn.class("FluxAdaLayerNormZero")
flux.AdaLayerNormZero = AdaLayerNormZero

function AdaLayerNormZero:init(o)
  self.dim, self.n = o[1], o.chunks or 6
  self.linear = self:add("linear", nn.Linear{self.dim, self.n * self.dim})
  self.norm = self:add("norm", nn.LayerNorm{self.dim, eps = EPS, elementwise_affine = false})
end

-- x [B, L, D], silu(temb) [B, D] -> modulated norm(x) [B, L, D], chunks {[B, D] x n}
function AdaLayerNormZero:updateOutput(g, x, semb)
  local emb = self.linear:forward(g, semb)
  local d, chunks = self.dim, {}
  for k = 1, self.n do chunks[k] = ck.slice(emb, 1, (k - 1) * d, d) end
  return ck.modulate(self.norm:forward(g, x), chunks[1], chunks[2]), chunks
end

-- AdaLayerNormContinuous (norm_out): linear(silu(temb)) is (scale, shift),
-- diffusers' order (BFL's final layer holds (shift, scale): ck.flux_keys swaps them)
local AdaLayerNormContinuous = nn.class("FluxAdaLayerNormContinuous")
flux.AdaLayerNormContinuous = AdaLayerNormContinuous

function AdaLayerNormContinuous:init(o)
  self.dim = o[1]
  self.linear = self:add("linear", nn.Linear{self.dim, 2 * self.dim})
  self.norm = self:add("norm", nn.LayerNorm{self.dim, eps = EPS, elementwise_affine = false})
end

function AdaLayerNormContinuous:updateOutput(g, x, semb)
  local emb = self.linear:forward(g, semb)
  local d = self.dim
  return ck.modulate(self.norm:forward(g, x), ck.slice(emb, 1, d, d), ck.slice(emb, 1, 0, d))
end

-- FluxAttention{dim, heads, head_dim, added = true (the double blocks' text
-- stream: add_*_proj, norm_added_*, to_add_out), pre_only = false (the single
-- blocks have no output projection)}: q, k, v with bias; an RMSNorm over each
-- head of q and k; the joint sequence is [text; image]; rope on q and k;
-- softmax(q k^T / sqrt(head_dim)) v over the joint sequence.
local FluxAttention = nn.class("FluxAttention")
flux.FluxAttention = FluxAttention

function FluxAttention:init(o)
  local d, hd = o[1], o.head_dim
  self.heads, self.head_dim = o.heads, hd
  self.norm_q = self:add("norm_q", nn.RMSNorm{hd, eps = EPS})
  self.norm_k = self:add("norm_k", nn.RMSNorm{hd, eps = EPS})
  self.to_q = self:add("to_q", nn.Linear{d, d})
  self.to_k = self:add("to_k", nn.Linear{d, d})
  self.to_v = self:add("to_v", nn.Linear{d, d})
  if not o.pre_only then self.to_out = self:add("to_out.0", nn.Linear{d, d}) end
  if o.added then
    self.norm_added_q = self:add("norm_added_q", nn.RMSNorm{hd, eps = EPS})
    self.norm_added_k = self:add("norm_added_k", nn.RMSNorm{hd, eps = EPS})
    self.add_q_proj = self:add("add_q_proj", nn.Linear{d, d})
    self.add_k_proj = self:add("add_k_proj", nn.Linear{d, d})
    self.add_v_proj = self:add("add_v_proj", nn.Linear{d, d})
    self.to_add_out = self:add("to_add_out", nn.Linear{d, d})
  end
end

-- the RMSNorm of each head: [B, L, H*hd] seen as [B, L, H, hd]
local function head_norm(g, norm, t, heads, hd)
  local s = t.shape
  return ck.reshape(norm:forward(g, ck.reshape(t, {s[1], s[2], heads, hd})), {s[1], s[2], heads * hd})
end

-- one stream's q (normed), k (normed), v
function FluxAttention:qkv(g, x, added)
  local h, hd = self.heads, self.head_dim
  if added then
    return head_norm(g, self.norm_added_q, self.add_q_proj:forward(g, x), h, hd),
           head_norm(g, self.norm_added_k, self.add_k_proj:forward(g, x), h, hd), self.add_v_proj:forward(g, x)
  end
  return head_norm(g, self.norm_q, self.to_q:forward(g, x), h, hd),
         head_norm(g, self.norm_k, self.to_k:forward(g, x), h, hd), self.to_v:forward(g, x)
end

-- softmax(q k^T / sqrt(head_dim) + mask.add) v over [B, L, H*hd] tensors,
-- each weight then multiplied by mask.keep (both [B, 1, 1, L]: 0 and
-- flux.MASKED, 0 and 1 per key), so a masked key's weight is exactly 0. The
-- attention op takes no mask, so this path is made of matmul, softmax and
-- the broadcast add, with the [B, H, L, L] weights a fused kernel avoids
-- (kohya's --apply_t5_attn_mask pays for them the same way in PyTorch's SDPA).
local function masked_attention(q, k, v, heads, mask)
  local s = q.shape
  local b, l, hd = s[1], s[2], s[3] // heads
  local function split(t) return ck.permute(ck.reshape(t, {b, l, heads, hd}), {0, 2, 1, 3}) end -- [B, H, L, hd]
  local w = ck.softmax(ck.scale(ck.matmul(split(q), split(k), {trans_b = true}), 1 / math.sqrt(hd)) + mask.add)
  w = w * mask.keep
  return ck.reshape(ck.permute(ck.matmul(w, split(v)), {0, 2, 1, 3}), {b, l, heads * hd})
end

-- double: x [B, Li, D] (image), c [B, Lt, D] (text) -> image out, text out;
-- single (pre_only): x [B, Lt+Li, D] -> attention [B, Lt+Li, D]. rope: the
-- table [Lt+Li, head_dim] of the joint sequence; mask: nil, or the keys kept
-- ({add, keep}, flux.joint_mask's) of the joint sequence.
function FluxAttention:updateOutput(g, x, c, rope, mask)
  local q, k, v = self:qkv(g, x, false)
  if c then
    local cq, ckk, cv = self:qkv(g, c, true)
    q, k, v = ck.concat(cq, q, 1), ck.concat(ckk, k, 1), ck.concat(cv, v, 1)
  end
  local o
  if mask then
    o = masked_attention(ck.rope(q, rope), ck.rope(k, rope), v, self.heads, mask)
  else
    o = ck.attention(ck.rope(q, rope), ck.rope(k, rope), v, self.heads)
  end
  if not c then return o end
  local lt, li = c.shape[2], x.shape[2]
  return self.to_out:forward(g, ck.slice(o, 1, lt, li)), self.to_add_out:forward(g, ck.slice(o, 1, 0, lt))
end

-- FeedForward(dim, activation_fn="gelu-approximate"): net.0.proj (to 4 dim), GELU tanh, net.2
local FeedForward = nn.class("FluxFeedForward")
flux.FeedForward = FeedForward

function FeedForward:init(o)
  local d = o[1]
  self.proj = self:add("net.0.proj", nn.Linear{d, 4 * d})
  self.out = self:add("net.2", nn.Linear{4 * d, d})
end

function FeedForward:updateOutput(g, x)
  return self.out:forward(g, ck.gelu(self.proj:forward(g, x), "tanh"))
end

-- FluxTransformerBlock (BFL's DoubleStreamBlock): each stream modulated by
-- its own AdaLayerNormZero, the joint attention, then each stream's gated
-- residuals of attention and feed-forward
local FluxTransformerBlock = nn.class("FluxTransformerBlock")
flux.FluxTransformerBlock = FluxTransformerBlock

function FluxTransformerBlock:init(o)
  local d = o[1]
  self.norm1 = self:add("norm1", AdaLayerNormZero{d})
  self.norm1_context = self:add("norm1_context", AdaLayerNormZero{d})
  self.attn = self:add("attn", FluxAttention{d, heads = o.heads, head_dim = o.head_dim, added = true})
  self.norm2 = self:add("norm2", nn.LayerNorm{d, eps = EPS, elementwise_affine = false})
  self.ff = self:add("ff", FeedForward{d})
  self.norm2_context = self:add("norm2_context", nn.LayerNorm{d, eps = EPS, elementwise_affine = false})
  self.ff_context = self:add("ff_context", FeedForward{d})
end

-- x [B, Li, D], c [B, Lt, D], silu(temb) [B, D], rope [Lt+Li, hd], mask (or nil) -> c, x
function FluxTransformerBlock:updateOutput(g, x, c, semb, rope, mask)
  local nx, m = self.norm1:forward(g, x, semb)
  local nc, mc = self.norm1_context:forward(g, c, semb)
  local ax, ac = self.attn:forward(g, nx, nc, rope, mask)
  x = ck.gate(x, m[3], ax)
  x = ck.gate(x, m[6], self.ff:forward(g, ck.modulate(self.norm2:forward(g, x), m[4], m[5])))
  c = ck.gate(c, mc[3], ac)
  c = ck.gate(c, mc[6], self.ff_context:forward(g, ck.modulate(self.norm2_context:forward(g, c), mc[4], mc[5])))
  return c, x
end

-- FluxSingleTransformerBlock (BFL's SingleStreamBlock) on the joint sequence:
-- attention and MLP side by side from one modulated norm, proj_out of both
-- concatenated, a gated residual
local FluxSingleTransformerBlock = nn.class("FluxSingleTransformerBlock")
flux.FluxSingleTransformerBlock = FluxSingleTransformerBlock

function FluxSingleTransformerBlock:init(o)
  local d = o[1]
  self.norm = self:add("norm", AdaLayerNormZero{d, chunks = 3})
  self.proj_mlp = self:add("proj_mlp", nn.Linear{d, 4 * d})
  self.proj_out = self:add("proj_out", nn.Linear{5 * d, d})
  self.attn = self:add("attn", FluxAttention{d, heads = o.heads, head_dim = o.head_dim, pre_only = true})
end

-- h [B, Lt+Li, D] (text then image), silu(temb), rope, mask (or nil) -> h
function FluxSingleTransformerBlock:updateOutput(g, h, semb, rope, mask)
  local nh, m = self.norm:forward(g, h, semb)
  local mlp = ck.gelu(self.proj_mlp:forward(g, nh), "tanh")
  local a = self.attn:forward(g, nh, nil, rope, mask)
  return ck.gate(h, m[3], self.proj_out:forward(g, ck.concat(a, mlp, 2)))
end

-- CombinedTimestep(Guidance)TextProjEmbeddings: each of timestep (and
-- guidance) times 1000 through the 256-channel sinusoid ([cos, sin]) and its
-- MLP, plus the pooled text through its MLP
local TimeTextEmbed = nn.class("FluxTimeTextEmbed")
flux.TimeTextEmbed = TimeTextEmbed

function TimeTextEmbed:init(o)
  local d = o[1]
  self.timestep_embedder = self:add("timestep_embedder", nn.TimestepEmbedding{flux.TIME_CHANNELS, d})
  if o.guidance then
    self.guidance_embedder = self:add("guidance_embedder", nn.TimestepEmbedding{flux.TIME_CHANNELS, d})
  end
  self.text_embedder = self:add("text_embedder", nn.TimestepEmbedding{o.pooled, d})
end

-- t * 1000 in fp32 (diffusers' timestep.to(dtype) * 1000), then the sinusoid
local function sinusoid(t)
  return ck.timestep_embedding(ck.scale(t, 1000), flux.TIME_CHANNELS, {flip_sin_to_cos = true, shift = 0})
end

function TimeTextEmbed:updateOutput(g, timestep, pooled, guidance)
  local emb = self.timestep_embedder:forward(g, sinusoid(timestep))
  if self.guidance_embedder then emb = emb + self.guidance_embedder:forward(g, sinusoid(guidance)) end
  return emb + self.text_embedder:forward(g, pooled)
end

local FluxTransformer2DModel = nn.class("FluxTransformer2DModel")
flux.FluxTransformer2DModel = FluxTransformer2DModel

-- FluxTransformer2DModel(config | name); registration follows diffusers'
-- state_dict order
function FluxTransformer2DModel:init(config)
  local c = flux.config(config or "flux-dev")
  self.config = c
  local d, hd, heads = flux.inner_dim(c), c.attention_head_dim, c.num_attention_heads
  self.time_text_embed = self:add("time_text_embed", TimeTextEmbed{d, guidance = c.guidance_embeds,
                                                                    pooled = c.pooled_projection_dim})
  self.context_embedder = self:add("context_embedder", nn.Linear{c.joint_attention_dim, d})
  self.x_embedder = self:add("x_embedder", nn.Linear{c.in_channels, d})
  self.transformer_blocks, self.single_transformer_blocks = {}, {}
  for i = 1, c.num_layers do
    self.transformer_blocks[i] = self:add("transformer_blocks." .. (i - 1),
      FluxTransformerBlock{d, heads = heads, head_dim = hd})
  end
  for i = 1, c.num_single_layers do
    self.single_transformer_blocks[i] = self:add("single_transformer_blocks." .. (i - 1),
      FluxSingleTransformerBlock{d, heads = heads, head_dim = hd})
  end
  self.norm_out = self:add("norm_out", AdaLayerNormContinuous{d})
  self.proj_out = self:add("proj_out", nn.Linear{d, c.patch_size * c.patch_size * c.out_channels})
end

-- hidden_states [B, Li, in_channels] (packed latents), encoder_hidden_states
-- [B, Lt, joint_attention_dim] (T5), pooled_projections [B, pooled] (CLIP-L),
-- timestep [B] (sigma in [0, 1]), rope [Lt+Li, head_dim] (a g:input set to
-- flux.rope_values), guidance [B] (dev only), mask (nil, or flux.joint_mask's
-- {add, keep}: the text tokens each sample's attention leaves out, kohya's
-- --apply_t5_attn_mask) -> [B, Li, out_channels].
-- The single blocks run on the joint sequence concatenated once (BFL's way;
-- diffusers concatenates and splits it around each block, the same values).
-- Errors name the line that called model:forward (the root module's forward
-- tail-calls this).
function FluxTransformer2DModel:updateOutput(g, hidden_states, encoder_hidden_states, pooled_projections, timestep,
                                             rope, guidance, mask)
  local c = self.config
  local lt, li = encoder_hidden_states.shape[2], hidden_states.shape[2]
  if c.guidance_embeds ~= (guidance ~= nil) then
    error(c.guidance_embeds and "FluxTransformer2DModel: this model embeds guidance (as flux-dev): give a guidance input"
      or "FluxTransformer2DModel: this model has no guidance embedder (as flux-schnell): give no guidance", 2)
  end
  local rs = rope and rope.shape
  if not rs or rs[1] ~= lt + li or rs[2] ~= c.attention_head_dim then
    error(string.format("FluxTransformer2DModel: the rope table must be [%d, %d] (%d text and %d image tokens), got %s",
      lt + li, c.attention_head_dim, lt, li, rs and ("[" .. table.concat(rs, ", ") .. "]") or "none"), 2)
  end
  local x = self.x_embedder:forward(g, hidden_states)
  local temb = self.time_text_embed:forward(g, timestep, pooled_projections, guidance)
  local txt = self.context_embedder:forward(g, encoder_hidden_states)
  local semb = ck.silu(temb)
  for _, blk in ipairs(self.transformer_blocks) do txt, x = blk:forward(g, x, txt, semb, rope, mask) end
  if #self.single_transformer_blocks > 0 then
    local h = ck.concat(txt, x, 1)
    for _, blk in ipairs(self.single_transformer_blocks) do h = blk:forward(g, h, semb, rope, mask) end
    x = ck.slice(h, 1, lt, li)
  end
  return self.proj_out:forward(g, self.norm_out:forward(g, x, semb))
end

---- packing and positions

-- flux.pack(latents [B, C, H, W]) -> [B, (H/2)(W/2), 4C]: each 2x2 patch a
-- token, channels-major inside it (BFL's rearrange "b c (h ph) (w pw) -> b (h
-- w) (c ph pw)", diffusers' _pack_latents)
function flux.pack(x)
  local s = x.shape
  local b, c, h, w = s[1], s[2], s[3], s[4]
  if #s ~= 4 or h % 2 ~= 0 or w % 2 ~= 0 then
    error("flux.pack: latents must be [B, C, H, W] with H and W even, got [" .. table.concat(s, ", ") .. "]", 2)
  end
  local t = ck.permute(ck.reshape(x, {b, c, h // 2, 2, w // 2, 2}), {0, 2, 4, 1, 3, 5})
  return ck.reshape(t, {b, (h // 2) * (w // 2), 4 * c})
end

-- flux.unpack(tokens [B, (H/2)(W/2), 4C], H, W) -> [B, C, H, W] (diffusers' _unpack_latents)
function flux.unpack(x, h, w)
  local s = x.shape
  local b, n, f = s[1], s[2], s[3]
  if #s ~= 3 or h % 2 ~= 0 or w % 2 ~= 0 or n ~= (h // 2) * (w // 2) or f % 4 ~= 0 then
    error(string.format("flux.unpack: tokens [%s] are not %dx%d latents packed 2x2", table.concat(s, ", "), h, w), 2)
  end
  local t = ck.permute(ck.reshape(x, {b, h // 2, w // 2, f // 4, 2, 2}), {0, 3, 1, 4, 2, 5})
  return ck.reshape(t, {b, f // 4, h, w})
end

-- flux.ids(tokens, h, w) -> the positions of the joint sequence: tokens text
-- ids {0, 0, 0}, then an image id {0, row, col} per 2x2 patch of h x w
-- latents in row-major order (BFL's prepare, diffusers' txt_ids and
-- _prepare_latent_image_ids)
function flux.ids(tokens, h, w)
  local ids = {}
  for i = 1, tokens do ids[i] = {0, 0, 0} end
  for r = 0, h // 2 - 1 do
    for c = 0, w // 2 - 1 do ids[#ids + 1] = {0, r, c} end
  end
  return ids
end

-- flux.rope_values(config, tokens, h, w) -> the flat [tokens + (h/2)(w/2), head_dim]
-- table a step sets its rope input to (nn.rope_table of flux.ids)
function flux.rope_values(config, tokens, h, w)
  local c = flux.config(config)
  return nn.rope_table(flux.ids(tokens, h, w), c.axes_dims_rope, flux.THETA)
end

---- graphs

-- Declares the transformer's inputs (outside any scope) for latents of
-- height x width (latent pixels, even) and tokens text tokens: hidden_states
-- [B, L, in_channels] (packed), encoder_hidden_states, pooled_projections,
-- timestep [B], guidance [B] (dev only), rope [tokens + L, head_dim], and
-- with mask = true t5_attn_mask [B, tokens] (1 for a caption's tokens and its
-- </s>, 0 for pads: T5's attention mask) and joint_ones [B, 1, 1, tokens + L]
-- (set it to 1; flux.joint_mask's constant).
-- opts: batch=1, height=64, width=height, tokens=512, latents=true (false: no
-- hidden_states and timestep, which an objective declares), mask=false.
-- Returns the table.
function flux.inputs(g, config, opts)
  opts = opts or {}
  local c = flux.config(config)
  local b, h = opts.batch or 1, opts.height or 64
  local w, tokens = opts.width or h, opts.tokens or 512
  for _, kv in ipairs{{"batch", b, 1}, {"height", h, 2}, {"width", w, 2}, {"tokens", tokens, 1}} do
    if math.type(kv[2]) ~= "integer" or kv[2] < kv[3] or (kv[3] == 2 and kv[2] % 2 ~= 0) then
      error("flux.inputs: " .. kv[1] .. " must be a whole number >= " .. kv[3] ..
            (kv[3] == 2 and " and even" or "") .. ", got " .. tostring(kv[2]), 2)
    end
  end
  local l = (h // 2) * (w // 2)
  local x = {}
  if opts.latents ~= false then
    x.hidden_states = g:input("hidden_states", {b, l, c.in_channels})
    x.timestep = g:input("timestep", {b})
  end
  x.encoder_hidden_states = g:input("encoder_hidden_states", {b, tokens, c.joint_attention_dim})
  x.pooled_projections = g:input("pooled_projections", {b, c.pooled_projection_dim})
  x.rope = g:input("rope", {tokens + l, c.attention_head_dim})
  if c.guidance_embeds then x.guidance = g:input("guidance", {b}) end
  if opts.mask then
    x.t5_attn_mask = g:input("t5_attn_mask", {b, tokens})
    x.joint_ones = g:input("joint_ones", {b, 1, 1, tokens + l})
  end
  return x
end

-- flux.joint_mask(x) -> nil, or {add, keep} [B, 1, 1, tokens + L] of inputs
-- x (flux.inputs{mask = true}'s): the text tokens' mask, every image token
-- kept, as kohya's --apply_t5_attn_mask masks the joint attention
function flux.joint_mask(x)
  if not x.t5_attn_mask then return nil end
  local s, l = x.t5_attn_mask.shape, x.joint_ones.shape[4]
  local b, tokens = s[1], s[2]
  local keep = ck.concat(ck.reshape(x.t5_attn_mask, {b, 1, 1, tokens}), ck.slice(x.joint_ones, 3, tokens, l - tokens), 3)
  return {keep = keep, add = ck.scale(keep - x.joint_ones, -flux.MASKED)}
end

-- flux.build(g, model | config | name, {batch=, height=, width=, tokens=, frozen=, mask=})
-- -> model, output [B, L, out_channels], inputs table
function flux.build(g, what, opts)
  opts = opts or {}
  local model
  if type(what) == "table" and getmetatable(what) and what.forward then
    model = what
  else
    model = FluxTransformer2DModel(what)
  end
  if opts.frozen then model:freeze() end
  local x = flux.inputs(g, model.config, opts)
  local y = model:forward(g, x.hidden_states, x.encoder_hidden_states, x.pooled_projections, x.timestep, x.rope,
                          x.guidance, flux.joint_mask(x))
  return model, y, x
end

-- flux.parameter_shapes(config) -> {name = shape}: every parameter of the
-- whole model (recorded on a graph of 2x2 latents and one text token; the
-- parameters do not depend on the sizes, and nothing is compiled)
local shape_sets = {}
function flux.parameter_shapes(config)
  local c = flux.config(config)
  local key = ck.json_encode(c)
  if not shape_sets[key] then
    local g = ck.graph()
    flux.build(g, c, {height = 2, width = 2, tokens = 1})
    local out = {}
    for _, t in ipairs(g:params()) do out[t.name] = t.shape end
    shape_sets[key] = out
  end
  local out = {}
  for k, v in pairs(shape_sets[key]) do out[k] = {table.unpack(v)} end
  return out
end

return flux

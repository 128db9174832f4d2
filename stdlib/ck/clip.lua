-- SDXL's two text encoders as ck graphs: transformers' CLIPTextModel (CLIP
-- ViT-L/14, SDXL's text_encoder) and CLIPTextModelWithProjection (OpenCLIP
-- ViT-bigG/14, text_encoder_2), built from config.json keys, with parameter
-- names as SDXL's checkpoint files have them, and the prompt embeddings of
-- diffusers' StableDiffusionXLPipeline.encode_prompt. Frozen.
--
--   local clip = require "ck.clip"
--   local g = ck.graph()
--   local te = clip.sdxl(g, "sdxl-l", "sdxl-g", {batch = 1})
--   local p = g:compile{outputs = {te.prompt_embeds, te.pooled}}
--   clip.load(p, te.l, "sdxl/text_encoder/model.safetensors")
--   clip.load(p, te.g, "sdxl/text_encoder_2/model.safetensors")
--   te:feed(p, ids_l, ids_g)        -- the two tokenizers' ids, {{77 ids}, ...}
--   p:forward()
--
-- The graph (per encoder layer, pre-LayerNorm as transformers):
--   h += out_proj(attention(layer_norm1(h)));  h += fc2(act(fc1(layer_norm2(h))))
-- Attention is built from ops, as ck.attention has no mask: per head,
-- softmax(q k^T / sqrt(d) + causal_mask) * causal_keep, times v. causal_mask is 0
-- on and below the diagonal and -1e30 above; the CPU's exp (ops/cpu/vecmath.h)
-- clamps its argument at -87, so softmax leaves e^-87 / sum (about 1e-38) there,
-- and the 0/1 causal_keep makes those weights exactly 0 (the row sums are at
-- least 1, so removing them changes no other weight's rounding). act is
-- quick_gelu (x sigmoid(1.702 x) = silu(1.702 x) / 1.702) or gelu (erf).
-- Token embeddings go through ck.embedding (ids are whole numbers stored as
-- floats; one outside the vocabulary stops the run with an error naming it).
-- The pooled row is picked by a one-hot [B, 1, T] matmul, exact in fp32 (not
-- under TF32 products, which round the hidden states to 10 mantissa bits).
local ck = require "ck"
local nn = require "ck.nn"

local clip = {}

clip.MASKED = -1e30 -- causal_mask above the diagonal

local copy = nn.copy

-- transformers' config.json keys. eos_token_id 2 is the value SDXL's files
-- carry (transformers' legacy rule: the pooled row is the argmax of the ids).
local configs = {
  ["sdxl-l"] = {
    architectures = {"CLIPTextModel"},
    vocab_size = 49408, hidden_size = 768, intermediate_size = 3072, num_hidden_layers = 12,
    num_attention_heads = 12, max_position_embeddings = 77, hidden_act = "quick_gelu", layer_norm_eps = 1e-5,
    projection_dim = 768, bos_token_id = 0, eos_token_id = 2, pad_token_id = 1,
  },
  ["sdxl-g"] = {
    architectures = {"CLIPTextModelWithProjection"},
    vocab_size = 49408, hidden_size = 1280, intermediate_size = 5120, num_hidden_layers = 32,
    num_attention_heads = 20, max_position_embeddings = 77, hidden_act = "gelu", layer_norm_eps = 1e-5,
    projection_dim = 1280, bos_token_id = 0, eos_token_id = 2, pad_token_id = 1,
  },
}
-- for the sdxl-tiny UNet (ck.unet): cross_attention_dim 64 = 32 + 32, pooled 64
-- = tiny-g's projection_dim; the full vocabulary, so real tokenizers' ids fit
configs["tiny-l"] = copy(configs["sdxl-l"])
do
  local t = configs["tiny-l"]
  t.hidden_size, t.intermediate_size, t.num_hidden_layers, t.num_attention_heads = 32, 128, 3, 4
  t.projection_dim = 32
end
configs["tiny-g"] = copy(configs["sdxl-g"])
do
  local t = configs["tiny-g"]
  t.hidden_size, t.intermediate_size, t.num_hidden_layers, t.num_attention_heads = 32, 128, 3, 4
  t.projection_dim = 64
end

-- transformers' CLIPTextConfig defaults, for keys a config.json leaves out
local defaults = {
  vocab_size = 49408, hidden_size = 512, intermediate_size = 2048, projection_dim = 512, num_hidden_layers = 12,
  num_attention_heads = 8, max_position_embeddings = 77, hidden_act = "quick_gelu", layer_norm_eps = 1e-5,
  bos_token_id = 49406, eos_token_id = 49407, pad_token_id = 1,
}

local counts = {"vocab_size", "hidden_size", "intermediate_size", "projection_dim", "num_hidden_layers",
                "num_attention_heads", "max_position_embeddings"}

-- clip.config("sdxl-l" | "sdxl-g" | "tiny-l" | "tiny-g" | table) -> a fresh config
-- table (safe to edit). A table is a transformers config.json as ck.json_decode
-- reads it: a CLIPTextConfig's keys, or a CLIPConfig's (its text_config is used).
function clip.config(what)
  local c
  if type(what) == "table" then
    c = copy(type(what.text_config) == "table" and what.text_config or what)
    for k, v in pairs(defaults) do if c[k] == nil then c[k] = v end end
  else
    c = configs[what or "sdxl-l"]
    if not c then error("clip: unknown config '" .. tostring(what) .. "' (sdxl-l, sdxl-g, tiny-l, tiny-g)", 2) end
    c = copy(c)
  end
  for _, k in ipairs(counts) do
    local v = math.tointeger(c[k])
    if not v or v < 1 then error("clip: config " .. k .. " must be a whole number >= 1, got " .. tostring(c[k]), 2) end
    c[k] = v
  end
  for _, k in ipairs{"eos_token_id", "bos_token_id", "pad_token_id"} do
    if c[k] ~= nil then c[k] = math.tointeger(c[k]) or error("clip: config " .. k .. " must be a whole number", 2) end
  end
  if c.hidden_size % c.num_attention_heads ~= 0 then
    error(string.format("clip: hidden_size %d is not a multiple of num_attention_heads %d", c.hidden_size,
                        c.num_attention_heads), 2)
  end
  if c.hidden_act ~= "quick_gelu" and c.hidden_act ~= "gelu" then
    error("clip: hidden_act '" .. tostring(c.hidden_act) .. "' is not one of quick_gelu, gelu", 2)
  end
  if type(c.layer_norm_eps) ~= "number" or not (c.layer_norm_eps > 0) then
    error("clip: layer_norm_eps must be a positive number, got " .. tostring(c.layer_norm_eps), 2)
  end
  return c
end

---- modules (ck.nn), named as transformers' state dict

local Embedding = nn.class("CLIPEmbedding")

function Embedding:init(o) self.num, self.dim = o[1], o[2] end

-- the rows that ids name, [ids.., dim]; without ids the table itself, [num, dim]
function Embedding:updateOutput(g, ids)
  local w = self:param(g, "weight", {self.num, self.dim}, {init = "normal", std = 0.02})
  return ids and ck.embedding(ids, w) or w
end

local Attention = nn.class("CLIPAttention")
clip.CLIPAttention = Attention

function Attention:init(c)
  local h = c.hidden_size
  self.heads, self.dim_head = c.num_attention_heads, h // c.num_attention_heads
  self.q_proj = self:add("q_proj", nn.Linear{h, h})
  self.k_proj = self:add("k_proj", nn.Linear{h, h})
  self.v_proj = self:add("v_proj", nn.Linear{h, h})
  self.out_proj = self:add("out_proj", nn.Linear{h, h})
end

-- x [B, T, C]; mask (additive) and keep (0/1) [T, T]
function Attention:updateOutput(g, x, mask, keep)
  local B, T = x.shape[1], x.shape[2]
  local H, D = self.heads, self.dim_head
  local function heads(t) return ck.permute(ck.reshape(t, {B, T, H, D}), {0, 2, 1, 3}) end -- [B, H, T, D]
  local q = heads(self.q_proj:forward(g, x))
  local k = heads(self.k_proj:forward(g, x))
  local v = heads(self.v_proj:forward(g, x))
  local s = ck.scale(ck.matmul(q, k, {trans_b = true}), D ^ -0.5) + mask -- [B, H, T, T]
  local w = ck.softmax(s) * keep
  self.weights = w -- the attention weights [B, H, T, T] of the last build (for inspection)
  local o = ck.permute(ck.matmul(w, v), {0, 2, 1, 3}) -- [B, T, H, D]
  return self.out_proj:forward(g, ck.reshape(o, {B, T, H * D}))
end

local MLP = nn.class("CLIPMLP")
clip.CLIPMLP = MLP

function MLP:init(c)
  self.act = c.hidden_act
  self.fc1 = self:add("fc1", nn.Linear{c.hidden_size, c.intermediate_size})
  self.fc2 = self:add("fc2", nn.Linear{c.intermediate_size, c.hidden_size})
end

local QUICK = 1.702

function MLP:updateOutput(g, x)
  local h = self.fc1:forward(g, x)
  if self.act == "quick_gelu" then h = ck.scale(ck.silu(ck.scale(h, QUICK)), 1 / QUICK)
  else h = ck.gelu(h) end
  return self.fc2:forward(g, h)
end

local EncoderLayer = nn.class("CLIPEncoderLayer")
clip.CLIPEncoderLayer = EncoderLayer

function EncoderLayer:init(c)
  local h, eps = c.hidden_size, c.layer_norm_eps
  self.layer_norm1 = self:add("layer_norm1", nn.LayerNorm{h, eps})
  self.self_attn = self:add("self_attn", Attention(c))
  self.layer_norm2 = self:add("layer_norm2", nn.LayerNorm{h, eps})
  self.mlp = self:add("mlp", MLP(c))
end

function EncoderLayer:updateOutput(g, x, mask, keep)
  x = x + self.self_attn:forward(g, self.layer_norm1:forward(g, x), mask, keep)
  return x + self.mlp:forward(g, self.layer_norm2:forward(g, x))
end

-- The text model: text_model.{embeddings, encoder.layers.N, final_layer_norm},
-- and text_projection beside it with a projection. o.layers: how many encoder
-- layers to build (fewer than the config's when the last are not needed).
local TextModel = nn.class("CLIPTextEncoder")
clip.CLIPTextEncoder = TextModel

function TextModel:init(c, o)
  self.config = c
  self.nlayers = o.layers
  self.final = o.final
  local h = c.hidden_size
  self.token_embedding = self:add("text_model.embeddings.token_embedding", Embedding{c.vocab_size, h})
  self.position_embedding = self:add("text_model.embeddings.position_embedding",
                                     Embedding{c.max_position_embeddings, h})
  self.layers = {}
  for i = 0, self.nlayers - 1 do
    self.layers[i + 1] = self:add("text_model.encoder.layers." .. i, EncoderLayer(c))
  end
  if self.final then
    self.final_layer_norm = self:add("text_model.final_layer_norm", nn.LayerNorm{h, c.layer_norm_eps})
  end
  if o.projection then
    self.text_projection = self:add("text_projection", nn.Linear{h, c.projection_dim, bias = false})
  end
end

-- ids [B, T]; mask, keep [T, T]; eos [B, 1, T] one-hot (with the final layer
-- norm). Returns {hidden_states = {embeddings, layer 1, ...}, last_hidden_state,
-- pooled} (the last two with the final layer norm; pooled projected with a projection).
function TextModel:updateOutput(g, ids, mask, keep, eos)
  local B, T = ids.shape[1], ids.shape[2]
  local pos = self.position_embedding:forward(g)
  if T < self.config.max_position_embeddings then pos = ck.slice(pos, 0, 0, T) end
  local h = self.token_embedding:forward(g, ids) + pos
  local r = {hidden_states = {h}}
  for i, layer in ipairs(self.layers) do
    h = layer:forward(g, h, mask, keep)
    r.hidden_states[i + 1] = h
  end
  if self.final then
    r.last_hidden_state = self.final_layer_norm:forward(g, h)
    r.pooled = ck.reshape(ck.matmul(eos, r.last_hidden_state), {B, self.config.hidden_size})
    if self.text_projection then r.pooled = self.text_projection:forward(g, r.pooled) end
  end
  return r
end

---- host-side inputs

-- The causal masks for T tokens, as flat row-major lists: additive (0 on and
-- below the diagonal, clip.MASKED above) and the 0/1 keep mask.
function clip.causal_masks(T)
  local add, keep = {}, {}
  for i = 1, T do
    for j = 1, T do
      add[#add + 1] = j > i and clip.MASKED or 0
      keep[#keep + 1] = j > i and 0 or 1
    end
  end
  return add, keep
end

-- The 0-based position of a row's pooled token, as transformers picks it: with
-- eos_token_id 2 (the legacy configs, SDXL's), the first largest id; otherwise
-- the first eos_token_id (0 when there is none, as torch's argmax of zeros).
function clip.eos_position(row, eos_token_id)
  local at = 1
  if eos_token_id == 2 then
    for i = 2, #row do if row[i] > row[at] then at = i end end
  else
    for i = 1, #row do
      if row[i] == eos_token_id then return i - 1 end
    end
  end
  return at - 1
end

-- ids as a list of B rows of T ids, or one flat list of B * T: checked (whole
-- numbers below the vocabulary) and returned as rows. Errors are raised at
-- `level`, counted from rows_of (the script line that fed the ids).
local function rows_of(ids, B, T, V, level)
  local function bad(...) error("clip: " .. string.format(...), level + 1) end
  if type(ids) ~= "table" then bad("ids must be a table of %d rows of %d ids, got %s", B, T, type(ids)) end
  local rows = {}
  if type(ids[1]) == "table" then
    if #ids ~= B then bad("%d rows of ids for a batch of %d", #ids, B) end
    for b = 1, B do rows[b] = ids[b] end
  else
    if #ids ~= B * T then bad("%d ids for %d rows of %d", #ids, B, T) end
    for b = 1, B do rows[b] = table.move(ids, (b - 1) * T + 1, b * T, 1, {}) end
  end
  for b = 1, B do
    local row = rows[b]
    if type(row) ~= "table" or #row ~= T then
      bad("row %d has %s ids, the encoder takes %d", b, type(row) == "table" and #row or "no", T)
    end
    for t = 1, T do
      local v = math.tointeger(row[t])
      if not v or v < 0 or v >= V then
        bad("row %d position %d: %s is not a token id (0 to %d)", b, t, tostring(row[t]), V - 1)
      end
    end
  end
  return rows
end

-- level: where errors point, counted from feed (2: its caller)
local function feed(enc, p, ids, level)
  local x, c = enc.inputs, enc.config
  local B, T = x.input_ids.shape[1], x.input_ids.shape[2]
  local rows = rows_of(ids, B, T, c.vocab_size, level + 1)
  local flat, onehot = {}, {}
  for b = 1, B do
    local e = clip.eos_position(rows[b], c.eos_token_id)
    for t = 1, T do
      flat[#flat + 1] = rows[b][t]
      onehot[#onehot + 1] = t - 1 == e and 1 or 0
    end
  end
  p:set(x.input_ids, flat)
  local add, keep = clip.causal_masks(T)
  p:set(x.causal_mask, add)
  p:set(x.causal_keep, keep)
  if x.eos_onehot then p:set(x.eos_onehot, onehot) end
end

-- enc:feed(p, ids): sets the encoder's inputs in program p: its ids (B rows of
-- T, or one flat list), the causal masks, and the pooled token's one-hot row
-- (transformers' rule, clip.eos_position). Ids that are no token ids of the
-- vocabulary are an error naming the row, the position and the caller's line.
function TextModel:feed(p, ids) feed(self, p, ids, 3) end

-- clip.load(p, enc, file_or_path): loads every parameter enc declared from a
-- safetensors file whose keys are transformers' without enc's prefix (a
-- diffusers folder's text_encoder/model.safetensors). A missing or misshaped
-- key is an error naming it; keys enc does not use (the layers a penultimate
-- build leaves out) are ignored.
function clip.load(p, enc, file)
  local opened <close> = type(file) == "string" and ck.safetensors(file) or nil
  local map = {}
  for _, e in ipairs(enc.param_names) do map[enc.prefix .. e] = e end
  p:load(opened or file, map)
end

---- building

-- clip.build(g, config, {batch=1, tokens=77, layers_needed="all"|"penultimate"|N,
--   projection=(config has CLIPTextModelWithProjection), prefix="", masks=})
-- -> encoder module, outputs {hidden_penultimate [B, T, H], hidden_states (the
-- embeddings' output then each layer's: hidden_states[-2] of transformers is
-- hidden_penultimate), last_hidden_state and pooled ([B, P] projected, else
-- [B, H]) when every layer is built}. layers_needed "penultimate" builds all
-- layers but the last and no final layer norm (no pooled output); a number N
-- builds N layers (0: the embeddings alone). Inputs (enc.inputs, outside any scope): prefix.."input_ids"
-- [B, T], prefix.."causal_mask" and .."causal_keep" [T, T] (or opts.masks =
-- {causal_mask=, causal_keep=} of another encoder), prefix.."eos_onehot"
-- [B, 1, T] with a pooled output; enc:feed(p, ids) sets them all.
-- Parameters: prefix .. transformers' keys, frozen.
function clip.build(g, config, opts)
  opts = opts or {}
  local c = type(config) == "table" and clip.config(config) or clip.config(config or "sdxl-l")
  local B, T = opts.batch or 1, opts.tokens or c.max_position_embeddings
  if T > c.max_position_embeddings then
    error(string.format("clip: %d tokens, the encoder has %d positions", T, c.max_position_embeddings), 2)
  end
  local n = opts.layers_needed or "all"
  local nl = n == "all" and c.num_hidden_layers or n == "penultimate" and c.num_hidden_layers - 1 or math.tointeger(n)
  if not nl or nl < 0 or nl > c.num_hidden_layers then
    error("clip: layers_needed must be \"all\", \"penultimate\" or 0 to " .. c.num_hidden_layers .. ", got "
          .. tostring(n), 2)
  end
  local projection = opts.projection
  if projection == nil then
    projection = type(c.architectures) == "table" and c.architectures[1] == "CLIPTextModelWithProjection"
  end
  local final = nl == c.num_hidden_layers
  local prefix = opts.prefix or ""
  if prefix ~= "" and prefix:sub(-1) ~= "." then prefix = prefix .. "." end
  local enc = TextModel(c, {layers = nl, final = final, projection = projection and final})
  enc:freeze()
  local base = g:current_scope()
  enc.prefix = (base ~= "" and base .. "." or "") .. prefix -- what a parameter's name has before its key
  local x = {input_ids = g:input(prefix .. "input_ids", {B, T})}
  if opts.masks then
    x.causal_mask, x.causal_keep = opts.masks.causal_mask, opts.masks.causal_keep
  else
    x.causal_mask = g:input(prefix .. "causal_mask", {T, T})
    x.causal_keep = g:input(prefix .. "causal_keep", {T, T})
  end
  if final then x.eos_onehot = g:input(prefix .. "eos_onehot", {B, 1, T}) end
  enc.inputs = x
  local n0 = #g:params()
  local r
  if prefix == "" then
    r = enc:forward(g, x.input_ids, x.causal_mask, x.causal_keep, x.eos_onehot)
  else
    r = g:scope(prefix:sub(1, -2), enc.forward, enc, g, x.input_ids, x.causal_mask, x.causal_keep, x.eos_onehot)
  end
  -- the names of what this build declared, without the prefix (clip.load's keys)
  enc.param_names = {}
  local params = g:params()
  for i = n0 + 1, #params do enc.param_names[#enc.param_names + 1] = params[i].name:sub(#enc.prefix + 1) end
  r.hidden_penultimate = r.hidden_states[c.num_hidden_layers]
  return enc, r
end

-- clip.sdxl(g, cfg_l, cfg_g, {batch=1, tokens=77, clip_skip=nil}) -> {prompt_embeds
-- [B, T, Hl + Hg], pooled [B, Pg], l, g (the encoders), feed} as diffusers'
-- StableDiffusionXLPipeline.encode_prompt: hidden_states[-2] of each
-- (-(clip_skip + 2) with clip_skip) concatenated on the channels, l first;
-- pooled is text_encoder_2's text_embeds. Parameters under "text_encoder." and
-- "text_encoder_2." (a diffusers folder's subfolders: clip.load(p, te.l,
-- "text_encoder/model.safetensors") loads one); l builds only the layers the
-- embeddings need. te:feed(p, ids_l, ids_g) sets both encoders' inputs from
-- the two tokenizers' ids (tokenizer pads with <|endoftext|>, tokenizer_2 with 0).
function clip.sdxl(g, cfg_l, cfg_g, opts)
  opts = opts or {}
  local cl, cg = clip.config(cfg_l or "sdxl-l"), clip.config(cfg_g or "sdxl-g")
  local skip = math.tointeger(opts.clip_skip or 0)
  if not skip or skip < 0 or skip > cl.num_hidden_layers - 1 or skip > cg.num_hidden_layers - 1 then
    error("clip: clip_skip must be a whole number from 0 to one below the layer count, got "
          .. tostring(opts.clip_skip), 2)
  end
  local o = {batch = opts.batch, tokens = opts.tokens}
  local te = {}
  o.prefix, o.projection, o.layers_needed = "text_encoder.", false, cl.num_hidden_layers - 1 - skip
  local rl
  te.l, rl = clip.build(g, cl, o)
  o.prefix, o.projection, o.layers_needed = "text_encoder_2.", true, "all"
  o.masks = te.l.inputs
  local rg
  te.g, rg = clip.build(g, cg, o)
  te.prompt_embeds = ck.concat(rl.hidden_states[#rl.hidden_states], rg.hidden_states[cg.num_hidden_layers - skip], 2)
  te.pooled = rg.pooled
  function te.feed(_, p, ids_l, ids_g)
    feed(te.l, p, ids_l, 3)
    feed(te.g, p, ids_g, 3)
  end
  return te
end

return clip

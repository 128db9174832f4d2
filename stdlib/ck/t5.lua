-- T5 v1.1's encoder (transformers' T5EncoderModel), Flux's text_encoder_2
-- (T5-XXL), as a ck graph with transformers' parameter names, loaded from the
-- files users have (a Flux folder's text_encoder_2/, a single file such as
-- ComfyUI's t5xxl_fp16 or t5xxl_fp8_e4m3fn), forward only, frozen.
--
--   local t5 = require "ck.t5"
--   local e <close> = t5.encoder{weights = "FLUX.1-dev/text_encoder_2", tokens = 512, storage = "bf16"}
--   local h = e:encode(ids [, mask])   -- ids {{512 ids}, ...} -> ck.array [B, 512, 4096]
--   -- e closed: its arena is gone before the transformer's programs are made
--
-- The graph, per block (pre-norm, as transformers):
--   h += o(attention(layer_norm(h)));  n = layer_norm(h);  h += wo(gelu_tanh(wi_0 n) * wi_1 n)
-- then encoder.final_layer_norm. T5LayerNorm is ck.rms_norm (the statistic in
-- fp32, a weight, no mean, no bias). Attention is per head softmax(q k^T +
-- position_bias) v with no 1/sqrt(d_kv) (T5 folds it into its initialization):
-- ck.attention takes no additive bias, so it is built from matmul, add and
-- softmax, each exact in fp32 and each with bf16 kernels on both devices; T5
-- runs forward once per caption, so the [B, H, L, L] logits a fused kernel
-- would avoid cost little. position_bias [H, L, L] is block 0's
-- relative_attention_bias table [buckets, H] gathered by ck.embedding at each
-- (query, key) pair's bucket, a graph input [L, L] that t5.position_buckets
-- computes on the host by T5's bidirectional log-bucketing; it is made once
-- and every block adds it, as transformers shares layer 0's bias. With a mask
-- (kohya's --apply_t5_attn_mask), padded keys get -1e30 added to the bias
-- (the CPU's exp clamps at -87: softmax leaves about 1e-38 there) and their
-- weights are then multiplied by the 0/1 mask, so they are exactly 0; without
-- one (Black Forest Labs' use) the pads are attended like any token.
local ck = require "ck"
local nn = require "ck.nn"

local t5 = {}

t5.MASKED = -1e30 -- added to the position bias at a padded key

local copy = nn.copy

local errors = require "ck.errors"
local fail, public, shape_str = errors.fail, errors.public, errors.shape_str

---- configs: transformers' T5Config keys

local configs = {
  -- google/t5-v1_1-xxl (kohya's flux_utils T5_CONFIG_JSON; a Flux folder's text_encoder_2/config.json)
  ["t5-xxl"] = {
    vocab_size = 32128, d_model = 4096, d_kv = 64, d_ff = 10240, num_layers = 24, num_heads = 64,
    relative_attention_num_buckets = 32, relative_attention_max_distance = 128, layer_norm_epsilon = 1e-6,
    feed_forward_proj = "gated-gelu",
  },
}
-- for CI and flux-tiny: the full vocabulary, so the real tokenizer's ids fit
configs["t5-tiny"] = copy(configs["t5-xxl"])
do
  local t = configs["t5-tiny"]
  t.d_model, t.d_kv, t.d_ff, t.num_layers, t.num_heads = 32, 8, 64, 2, 4
end

-- transformers' T5Config defaults, for keys a config.json leaves out
local defaults = {
  vocab_size = 32128, d_model = 512, d_kv = 64, d_ff = 2048, num_layers = 6, num_heads = 8,
  relative_attention_num_buckets = 32, relative_attention_max_distance = 128, layer_norm_epsilon = 1e-6,
  feed_forward_proj = "relu",
}

local counts = {"vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads", "relative_attention_num_buckets",
                "relative_attention_max_distance"}

-- feed_forward_proj "gated-ACT" with ACT a tanh form of GELU (T5Config makes
-- "gated-gelu" gelu_new; gelu_pytorch_tanh and gelu_fast are the same function)
local GATED = {["gated-gelu"] = true, ["gated-gelu_new"] = true, ["gated-gelu_pytorch_tanh"] = true,
               ["gated-gelu_fast"] = true}

local function config(what, file)
  local where = file and file .. ": " or "t5: "
  local function bad(fmt, ...) fail("%s" .. fmt, where, ...) end
  local c
  if type(what) == "table" then
    c = {}
    for k, v in pairs(what) do if v ~= ck.json_null then c[k] = copy(v) end end
    for k, v in pairs(defaults) do if c[k] == nil then c[k] = v end end
  else
    c = configs[what or "t5-xxl"]
    if not c then bad("unknown config '%s' (t5-xxl, t5-tiny)", tostring(what)) end
    c = copy(c)
  end
  for _, k in ipairs(counts) do
    local v = math.tointeger(c[k])
    if math.type(c[k]) == "float" and v then v = nil end -- 64.0 in a JSON file is not a count
    if not v or v < 1 or v > 2 ^ 31 - 1 then bad("key '%s' must be a whole number >= 1, got %s", k, tostring(c[k])) end
    c[k] = v
  end
  if type(c.model_type) ~= "nil" and c.model_type ~= "t5" then
    bad("key 'model_type' is %s; ck.t5 builds T5 (t5)", tostring(c.model_type))
  end
  if c.is_decoder ~= nil and c.is_decoder ~= false then bad("key 'is_decoder' is %s; ck.t5 builds the encoder",
    tostring(c.is_decoder)) end
  if not GATED[c.feed_forward_proj] then
    bad("key 'feed_forward_proj' is %s; ck.t5 builds T5 v1.1's gated GELU (gated-gelu)", tostring(c.feed_forward_proj))
  end
  if type(c.layer_norm_epsilon) ~= "number" or not (c.layer_norm_epsilon > 0 and c.layer_norm_epsilon < 1) then
    bad("key 'layer_norm_epsilon' must be a number between 0 and 1, got %s", tostring(c.layer_norm_epsilon))
  end
  -- bidirectional bucketing halves the buckets, and half of those are exact:
  -- the log-spaced rest needs at least one exact bucket and a distance past it
  local exact = c.relative_attention_num_buckets // 4
  if exact < 1 then
    bad("key 'relative_attention_num_buckets' must be at least 4, got %d", c.relative_attention_num_buckets)
  end
  if c.relative_attention_max_distance <= exact then
    bad("key 'relative_attention_max_distance' (%d) must exceed a quarter of the buckets (%d)",
        c.relative_attention_max_distance, exact)
  end
  return c
end

-- t5.config("t5-xxl" | "t5-tiny" | table [, file]) -> a fresh config (safe to
-- edit). A table is a config.json as ck.json_decode reads it (T5Config's
-- keys; missing keys take T5Config's defaults), checked by type, sign and
-- range; errors name file when given.
t5.config = public(config)

-- The parameters of the encoder of config c: {name = shape}, transformers' keys.
local function architecture(c)
  local D, inner, F = c.d_model, c.num_heads * c.d_kv, c.d_ff
  local a = {["shared.weight"] = {c.vocab_size, D}, ["encoder.final_layer_norm.weight"] = {D}}
  for i = 0, c.num_layers - 1 do
    local b = "encoder.block." .. i .. ".layer."
    for _, n in ipairs{"q", "k", "v"} do a[b .. "0.SelfAttention." .. n .. ".weight"] = {inner, D} end
    a[b .. "0.SelfAttention.o.weight"] = {D, inner}
    a[b .. "0.layer_norm.weight"] = {D}
    a[b .. "1.DenseReluDense.wi_0.weight"] = {F, D}
    a[b .. "1.DenseReluDense.wi_1.weight"] = {F, D}
    a[b .. "1.DenseReluDense.wo.weight"] = {D, F}
    a[b .. "1.layer_norm.weight"] = {D}
  end
  a["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] =
    {c.relative_attention_num_buckets, c.num_heads}
  return a
end

-- t5.parameter_names(config) -> {name = shape} of the whole encoder: the keys
-- a file must hold (shared.weight, or its tied copy encoder.embed_tokens.weight)
t5.parameter_names = public(function(c)
  return architecture(config(c))
end)

---- the relative position buckets

local function f32(x) return (string.unpack("f", string.pack("f", x))) end

-- The bucket of a key `rel` positions after its query (negative: before), as
-- transformers' T5Attention._relative_position_bucket(bidirectional=True):
-- half the buckets for keys after, half for keys before; within each half the
-- first half exact, the rest log-spaced up to max_distance, beyond which one
-- bucket holds all. torch computes the log-spaced part in float32, and so
-- does this, step by step (distances such as 16, 32 and 64 of t5-v1_1's sit
-- exactly on a bucket's edge).
function t5.relative_position_bucket(rel, num_buckets, max_distance)
  local n = num_buckets // 2
  local b = rel > 0 and n or 0
  rel = math.abs(rel)
  local exact = n // 2
  if rel < exact then return b + rel end
  local v = f32(f32(math.log(f32(rel / exact))) / f32(math.log(max_distance / exact)))
  local large = exact + math.floor(f32(v * (n - exact)))
  return b + math.min(large, n - 1)
end

-- The [L, L] table of buckets the position bias gathers: row i (query), column
-- j (key) holds the bucket of j - i. A flat ck.array, made once per length.
function t5.position_buckets(L, c)
  local nb, md = c.relative_attention_num_buckets, c.relative_attention_max_distance
  local by = {}
  for rel = -(L - 1), L - 1 do by[rel] = t5.relative_position_bucket(rel, nb, md) end
  local a = ck.array({L, L})
  local k = 0
  for i = 0, L - 1 do
    for j = 0, L - 1 do
      k = k + 1
      a:set(k, by[j - i])
    end
  end
  return a
end

---- modules (ck.nn), named as transformers' state dict

local Embedding = nn.class("T5Embedding")

function Embedding:init(o) self.num, self.dim = o[1], o[2] end

-- the rows that ids name, [ids.., dim]
function Embedding:updateOutput(g, ids)
  return ck.embedding(ids, self:param(g, "weight", {self.num, self.dim}, {init = "normal", std = 1}))
end

local Attention = nn.class("T5Attention")
t5.T5Attention = Attention

function Attention:init(c, has_bias)
  local D, inner = c.d_model, c.num_heads * c.d_kv
  self.heads, self.d_kv = c.num_heads, c.d_kv
  self.q = self:add("q", nn.Linear{D, inner, bias = false})
  self.k = self:add("k", nn.Linear{D, inner, bias = false})
  self.v = self:add("v", nn.Linear{D, inner, bias = false})
  self.o = self:add("o", nn.Linear{inner, D, bias = false})
  if has_bias then
    self.relative_attention_bias = self:add("relative_attention_bias",
                                            Embedding{c.relative_attention_num_buckets, c.num_heads})
  end
end

-- x [B, L, D]; bias the position bias ([H, L, L], or [B, H, L, L] with a
-- mask), made here in block 0 from buckets [L, L] and mask_add [B, 1, 1, L];
-- keep [B, 1, 1, L] (0/1) or nil. Returns the output and the bias.
function Attention:updateOutput(g, x, bias, buckets, mask_add, keep)
  local B, L = x.shape[1], x.shape[2]
  local H, K = self.heads, self.d_kv
  if not bias then
    bias = ck.permute(self.relative_attention_bias:forward(g, buckets), {2, 0, 1}) -- [L, L, H] -> [H, L, L]
    if mask_add then bias = bias + mask_add end
  end
  local function heads(t) return ck.permute(ck.reshape(t, {B, L, H, K}), {0, 2, 1, 3}) end -- [B, H, L, K]
  local q = heads(self.q:forward(g, x))
  local k = heads(self.k:forward(g, x))
  local v = heads(self.v:forward(g, x))
  local w = ck.softmax(ck.matmul(q, k, {trans_b = true}) + bias) -- [B, H, L, L]
  if keep then w = w * keep end
  self.weights = w -- the attention weights of the last build (for inspection)
  local o = ck.permute(ck.matmul(w, v), {0, 2, 1, 3}) -- [B, L, H, K]
  return self.o:forward(g, ck.reshape(o, {B, L, H * K})), bias
end

local LayerSelfAttention = nn.class("T5LayerSelfAttention")

function LayerSelfAttention:init(c, has_bias)
  self.SelfAttention = self:add("SelfAttention", Attention(c, has_bias))
  self.layer_norm = self:add("layer_norm", nn.RMSNorm{c.d_model, eps = c.layer_norm_epsilon})
end

function LayerSelfAttention:updateOutput(g, x, ...)
  local a, bias = self.SelfAttention:forward(g, self.layer_norm:forward(g, x), ...)
  return x + a, bias
end

local DenseGatedActDense = nn.class("T5DenseGatedActDense")
t5.T5DenseGatedActDense = DenseGatedActDense

function DenseGatedActDense:init(c)
  self.wi_0 = self:add("wi_0", nn.Linear{c.d_model, c.d_ff, bias = false})
  self.wi_1 = self:add("wi_1", nn.Linear{c.d_model, c.d_ff, bias = false})
  self.wo = self:add("wo", nn.Linear{c.d_ff, c.d_model, bias = false})
end

function DenseGatedActDense:updateOutput(g, x)
  local a = ck.gelu(self.wi_0:forward(g, x), "tanh")
  return self.wo:forward(g, a * self.wi_1:forward(g, x))
end

local LayerFF = nn.class("T5LayerFF")

function LayerFF:init(c)
  self.DenseReluDense = self:add("DenseReluDense", DenseGatedActDense(c))
  self.layer_norm = self:add("layer_norm", nn.RMSNorm{c.d_model, eps = c.layer_norm_epsilon})
end

function LayerFF:updateOutput(g, x)
  return x + self.DenseReluDense:forward(g, self.layer_norm:forward(g, x))
end

local Block = nn.class("T5Block")
t5.T5Block = Block

function Block:init(c, has_bias)
  self.attn = self:add("layer.0", LayerSelfAttention(c, has_bias))
  self.ff = self:add("layer.1", LayerFF(c))
end

function Block:updateOutput(g, x, ...)
  local h, bias = self.attn:forward(g, x, ...)
  return self.ff:forward(g, h), bias
end

-- The whole encoder: shared (the token embeddings), encoder.block.N,
-- encoder.final_layer_norm.
local Encoder = nn.class("T5EncoderModel")
t5.T5EncoderModel = Encoder

function Encoder:init(c)
  self.config = c
  self.shared = self:add("shared", Embedding{c.vocab_size, c.d_model})
  self.blocks = {}
  for i = 0, c.num_layers - 1 do self.blocks[i + 1] = self:add("encoder.block." .. i, Block(c, i == 0)) end
  self.final_layer_norm = self:add("encoder.final_layer_norm", nn.RMSNorm{c.d_model, eps = c.layer_norm_epsilon})
end

-- ids [B, L]; buckets [L, L]; mask_add, keep [B, 1, 1, L] or nil -> last_hidden_state [B, L, D]
function Encoder:updateOutput(g, ids, buckets, mask_add, keep)
  local h = self.shared:forward(g, ids)
  local bias
  for _, block in ipairs(self.blocks) do h, bias = block:forward(g, h, bias, buckets, mask_add, keep) end
  return self.final_layer_norm:forward(g, h)
end

---- building and feeding

-- t5.build(g, config, {batch = 1, tokens = 512, mask = false, prefix = ""}) ->
-- encoder module, {last_hidden_state [B, L, d_model]}. Inputs (enc.inputs,
-- outside any scope): prefix.."input_ids" [B, L], prefix.."relative_position_bucket"
-- [L, L], and with mask = true prefix.."attention_mask" [B, 1, 1, L] (0/1)
-- and prefix.."attention_mask_add" (0 or t5.MASKED); enc:feed(p, ids [, mask])
-- sets them all. Parameters: prefix .. transformers' keys, frozen.
local function build(g, cfg, opts)
  opts = opts or {}
  local c = config(cfg or "t5-xxl")
  local B, L = math.tointeger(opts.batch or 1), math.tointeger(opts.tokens or 512)
  if not B or B < 1 then fail("t5.build: batch must be a whole number >= 1, got %s", tostring(opts.batch)) end
  if not L or L < 1 then fail("t5.build: tokens must be a whole number >= 1, got %s", tostring(opts.tokens)) end
  local prefix = opts.prefix or ""
  if prefix ~= "" and prefix:sub(-1) ~= "." then prefix = prefix .. "." end
  local enc = Encoder(c)
  enc:freeze()
  local base = g:current_scope()
  enc.prefix = (base ~= "" and base .. "." or "") .. prefix
  local x = {input_ids = g:input(prefix .. "input_ids", {B, L}),
             relative_position_bucket = g:input(prefix .. "relative_position_bucket", {L, L})}
  if opts.mask then
    x.attention_mask = g:input(prefix .. "attention_mask", {B, 1, 1, L})
    x.attention_mask_add = g:input(prefix .. "attention_mask_add", {B, 1, 1, L})
  end
  enc.inputs, enc.batch, enc.tokens = x, B, L
  local n0 = #g:params()
  local args = {x.input_ids, x.relative_position_bucket, x.attention_mask_add, x.attention_mask}
  local h
  if prefix == "" then h = enc:forward(g, table.unpack(args, 1, 4))
  else h = g:scope(prefix:sub(1, -2), enc.forward, enc, g, table.unpack(args, 1, 4)) end
  enc.param_names = {} -- without the prefix: t5.load's keys
  local params = g:params()
  for i = n0 + 1, #params do enc.param_names[#enc.param_names + 1] = params[i].name:sub(#enc.prefix + 1) end
  return enc, {last_hidden_state = h}
end
t5.build = public(build)

-- rows of ids (B rows of L, or one flat list of B * L) checked against lo..hi
-- (whole numbers) -> one flat list; errors name the row and position and
-- point where feed's level does
local function rows_of(what, ids, B, L, lo, hi, level)
  local function bad(...) error("t5: " .. string.format(...), level + 2) end
  if type(ids) ~= "table" then bad("%s must be a table of %d rows of %d, got %s", what, B, L, type(ids)) end
  local flat = {}
  if type(ids[1]) == "table" then
    if #ids ~= B then bad("%d rows of %s for a batch of %d", #ids, what, B) end
    for b = 1, B do
      local row = ids[b]
      if type(row) ~= "table" or #row ~= L then
        bad("%s row %d has %s entries, the encoder takes %d", what, b, type(row) == "table" and #row or "no", L)
      end
      table.move(row, 1, L, (b - 1) * L + 1, flat)
    end
  else
    if #ids ~= B * L then bad("%d %s for %d rows of %d", #ids, what, B, L) end
    table.move(ids, 1, B * L, 1, flat)
  end
  for i = 1, B * L do
    local v = math.tointeger(flat[i])
    if not v or v < lo or v > hi then
      bad("%s row %d position %d: %s is not %s", what, (i - 1) // L + 1, (i - 1) % L + 1, tostring(flat[i]),
          what == "mask" and "0 or 1" or string.format("a token id (0 to %d)", hi))
    end
    flat[i] = v
  end
  return flat
end

-- level: where errors point, counted from feed (2: its caller)
local function feed(enc, p, ids, mask, level)
  local x, c, B, L = enc.inputs, enc.config, enc.batch, enc.tokens
  p:set(x.input_ids, rows_of("ids", ids, B, L, 0, c.vocab_size - 1, level))
  if (mask ~= nil) ~= (x.attention_mask ~= nil) then
    error("t5: " .. (mask and "a mask for an encoder built without one (t5.build{mask = true})"
      or "this encoder was built with a mask: give one (rows of 0/1)"), level)
  end
  if mask then
    local keep = rows_of("mask", mask, B, L, 0, 1, level)
    local add = {}
    for b = 1, B do
      local any = false
      for t = (b - 1) * L + 1, b * L do
        add[t] = keep[t] == 1 and 0 or t5.MASKED
        any = any or keep[t] == 1
      end
      if not any then error(string.format("t5: mask row %d keeps no token", b), level) end
    end
    p:set(x.attention_mask, keep)
    p:set(x.attention_mask_add, add)
  end
  enc.buckets = enc.buckets or t5.position_buckets(L, c) -- a function of the length alone
  p:set(x.relative_position_bucket, enc.buckets)
end

-- enc:feed(p, ids [, mask]): sets the encoder's inputs in program p: ids (B
-- rows of L token ids, or one flat list), the position buckets, and for an
-- encoder built with mask = true the attention mask (rows of 0/1, as
-- transformers' tokenizers give it: 1 for tokens and EOS, 0 for pads; each
-- row keeps at least one token). A mask given to an encoder built without
-- one, and one missing where it was built with one, are errors naming the
-- caller's line.
function Encoder:feed(p, ids, mask) feed(self, p, ids, mask, 3) end

---- weights: the files users have

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

local function read_json(path)
  local f, err = io.open(path, "rb")
  if not f then fail("%s", err) end
  local text = f:read("a")
  f:close()
  local ok, v = pcall(ck.json_decode, text)
  if not ok or type(v) ~= "table" then fail("%s: not a JSON object: %s", path, tostring(v)) end
  return v
end

local LOADS = {F32 = true, F16 = true, BF16 = true, F8_E4M3 = true, F8_E5M2 = true}

-- why a key is no parameter of the encoder, where a hint helps
local function hint(name)
  if name:match("^decoder%.") or name == "lm_head.weight" then
    return " (T5's decoder: ck.t5 loads the encoder, a T5EncoderModel's file)"
  elseif name == "scaled_fp8" or name:match("%.scale_weight$") or name:match("%.scale_input$") then
    return " (ComfyUI's scaled fp8 layout, weights times a scale: use t5xxl_fp8_e4m3fn or an fp16/bf16 file)"
  elseif name:match("DenseReluDense%.wi%.weight$") then
    return " (T5 v1.0's ReLU feed-forward: ck.t5 builds v1.1's gated GELU)"
  end
  return ""
end

-- The config a single file's shapes imply: every count is in a tensor's shape
-- but relative_attention_max_distance and layer_norm_epsilon, which are T5
-- v1.1's (128, 1e-6).
local function infer_config(shapes, file)
  local function need(name)
    local s = shapes[name]
    if not s or #s ~= 2 then fail("%s: no 2-D tensor '%s': not a T5 encoder's file", file, name) end
    return s
  end
  local emb = shapes["encoder.embed_tokens.weight"] and not shapes["shared.weight"]
    and need("encoder.embed_tokens.weight") or need("shared.weight")
  local rab = need("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
  local q = need("encoder.block.0.layer.0.SelfAttention.q.weight")
  if shapes["encoder.block.0.layer.1.DenseReluDense.wi.weight"] then
    fail("%s: tensor 'encoder.block.0.layer.1.DenseReluDense.wi.weight'%s", file,
      hint("encoder.block.0.layer.1.DenseReluDense.wi.weight"))
  end
  local wi = need("encoder.block.0.layer.1.DenseReluDense.wi_0.weight")
  local layers = 0
  for name in pairs(shapes) do
    local i = name:match("^encoder%.block%.(%d+)%.")
    if i then layers = math.max(layers, tonumber(i) + 1) end
  end
  if q[1] % rab[2] ~= 0 then
    fail("%s: q.weight's %d rows are not a multiple of the %d heads of relative_attention_bias", file, q[1], rab[2])
  end
  return {vocab_size = emb[1], d_model = emb[2], d_kv = q[1] // rab[2], d_ff = wi[1], num_layers = layers,
          num_heads = rab[2], relative_attention_num_buckets = rab[1], relative_attention_max_distance = 128,
          layer_norm_epsilon = 1e-6, feed_forward_proj = "gated-gelu"}
end

-- the keys of one file: {name -> {key =, file =, shape =, dtype =}} for the
-- keys under prefix (the prefix cut), every other key left to the caller
local function scan(file, prefix, into)
  local f <close> = ck.safetensors(file)
  for _, k in ipairs(f:keys()) do
    if k:sub(1, #prefix) == prefix then
      into[k:sub(#prefix + 1)] = {key = k, file = file, shape = f:shape(k), dtype = f:dtype(k)}
    end
  end
end

-- a folder's weights: model.safetensors, or the shards its index names
local function folder_files(dir, variant)
  local stems = {"model.safetensors", "model.fp16.safetensors"}
  if variant == "fp16" then stems = {stems[2], stems[1]} end
  for _, n in ipairs(stems) do
    if exists(dir .. "/" .. n) then return dir .. "/" .. n, {dir .. "/" .. n} end
  end
  for _, n in ipairs(stems) do
    local index = dir .. "/" .. n .. ".index.json"
    if exists(index) then
      local wm = rawget(read_json(index), "weight_map")
      if type(wm) ~= "table" then fail("%s: no weight_map object", index) end
      local files, seen = {}, {}
      for k, shard in pairs(wm) do
        if type(k) ~= "string" or type(shard) ~= "string" or shard:find("/", 1, true) or shard:find("\\", 1, true)
          or shard:find("..", 1, true) or shard == "" then
          fail("%s: weight_map entry '%s' must name a file of this folder", index, tostring(k))
        end
        if not seen[shard] then
          seen[shard] = true
          files[#files + 1] = dir .. "/" .. shard
        end
      end
      table.sort(files)
      return index, files, wm
    end
  end
  fail("%s: no weights (model.safetensors, or model.safetensors.index.json and its shards)", dir)
end

local function open(path, opts)
  if type(path) ~= "string" then fail("t5.open: path must be a string, got %s", type(path)) end
  opts = opts or {}
  path = path:gsub("(.)/+$", "%1")
  local prefix = opts.prefix or ""
  local d = {}
  local tensors = {}
  local given = opts.config
  if ck.listdir(path) then
    -- a Flux (or SD3) diffusers folder names its T5 text_encoder_2 (SD3: text_encoder_3)
    if not exists(path .. "/config.json") then
      for _, sub in ipairs{"text_encoder_2", "text_encoder_3"} do
        if exists(path .. "/" .. sub .. "/config.json") and
          read_json(path .. "/" .. sub .. "/config.json").model_type == "t5" then
          path = path .. "/" .. sub
          break
        end
      end
    end
    if not exists(path .. "/config.json") then fail("%s: no config.json (a T5 encoder's folder has one)", path) end
    d.config_file = path .. "/config.json"
    d.config_json = read_json(d.config_file)
    local index, files, wm = folder_files(path, opts.variant)
    d.kind, d.file, d.files = "folder", index, files
    for _, file in ipairs(files) do scan(file, prefix, tensors) end
    if wm then -- every shard holds what the index says it holds
      for k, shard in pairs(wm) do
        local t = tensors[k:sub(#prefix + 1)]
        if k:sub(1, #prefix) == prefix and (not t or t.file ~= path .. "/" .. shard) then
          fail("%s: missing tensor '%s' (named by %s)", path .. "/" .. shard, k, index)
        end
      end
    end
  else
    d.kind, d.file, d.files = "single", path, {path}
    scan(path, prefix, tensors)
  end
  local shapes = {}
  for name, t in pairs(tensors) do shapes[name] = t.shape end
  local c
  if given then c = config(given)
  elseif d.config_json then c = config(d.config_json, d.config_file)
  else c = config(infer_config(shapes, d.file), d.file) end
  d.config = c
  -- every key a parameter of this encoder (or the tied copy of shared.weight),
  -- with its shape and a dtype p:load reads; every parameter with a key
  local arch = architecture(c)
  local map, names = {}, {}
  for name in pairs(tensors) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local t = tensors[name]
    local as = name == "encoder.embed_tokens.weight" and "shared.weight" or name
    local want = arch[as]
    if not want then
      fail("%s: tensor '%s' is no parameter of T5's encoder%s", t.file, t.key, hint(name))
    end
    local s = t.shape
    local same = #s == #want
    for i = 1, #want do same = same and s[i] == want[i] end
    if not same then
      fail("%s: tensor '%s' has shape %s; the encoder of this config has %s", t.file, t.key, shape_str(s),
           shape_str(want))
    end
    if not LOADS[t.dtype] then
      fail("%s: tensor '%s' is %s; ck.t5 loads F32, F16, BF16, F8_E4M3 and F8_E5M2", t.file, t.key, tostring(t.dtype))
    end
    -- shared.weight first; a file holding only the tied copy loads that
    if name ~= "encoder.embed_tokens.weight" or not tensors["shared.weight"] then
      map[as] = d.kind == "folder" and {key = t.key, file = t.file} or t.key
    end
  end
  local missing = {}
  for name in pairs(arch) do if not map[name] then missing[#missing + 1] = name end end
  table.sort(missing)
  if #missing > 0 then
    local total = 0
    for _ in pairs(arch) do total = total + 1 end
    fail("%s: no tensor '%s%s'%s (%d of the encoder's %d missing)", d.file, prefix, missing[1],
      missing[1] == "shared.weight" and " (nor encoder.embed_tokens.weight)" or "", #missing, total)
  end
  d.map = map
  return d
end

-- t5.open(path [, {config = name | table, prefix = "", variant = "fp16"}]) ->
-- {kind = "folder" | "single", file, files, config (checked), config_json,
-- map = {transformers' name -> key | {key =, file =}}}. path: a folder with
-- config.json and model.safetensors or model.safetensors.index.json and its
-- shards (a Flux folder's text_encoder_2/, or the Flux folder itself), or
-- one .safetensors file (transformers' keys: ComfyUI's t5xxl_fp16,
-- t5xxl_fp8_e4m3fn), whose config its shapes imply unless opts.config gives
-- one. Every key is a parameter of the encoder (shared.weight, or its tied
-- copy encoder.embed_tokens.weight: with both, shared.weight loads), of the
-- config's shape and a dtype ck reads, and every parameter has a key; anything
-- else is refused in one line naming the file and the key. prefix: the
-- keys' prefix in a file that holds other models too (keys without it are
-- not the encoder's and are left alone).
t5.open = public(open)

-- t5.load(p, enc, desc_or_path): loads every parameter enc declared (t5.build)
-- from t5.open's description (or a path it opens) into program p.
local function load(p, enc, what)
  local d = type(what) == "string" and open(what) or what
  if type(d) ~= "table" or type(d.map) ~= "table" then fail("t5.load: give t5.open's description or a path") end
  local by_file, order = {}, {}
  for _, name in ipairs(enc.param_names) do
    local src = d.map[name]
    if src == nil then fail("%s: no tensor for the encoder's '%s'", d.file, name) end
    local file = type(src) == "table" and src.file or d.file
    local key = type(src) == "table" and src.key or src
    if not by_file[file] then
      by_file[file] = {}
      order[#order + 1] = file
    end
    by_file[file][enc.prefix .. name] = key
  end
  for _, file in ipairs(order) do
    local f <close> = ck.safetensors(file)
    p:load(f, by_file[file])
  end
end
t5.load = public(load)

---- the encoder as a program

local Program = {}
Program.__index = Program
Program.__close = function(self) self:close() end

-- t5.encoder{weights = path | t5.open's description | nil, config = name |
-- table (default: the weights', else t5-tiny with random weights drawn from
-- seed), batch = 1, tokens = 512, mask = false, storage = "fp32" | "bf16",
-- frozen = "bf16" | "fp8", device = nil, seed = 1, prefix = ""} -> an
-- encoder program: e:encode(ids [, mask]) -> last_hidden_state as a ck.array
-- [batch, tokens, d_model]; e.program, e.enc (t5.build's), e.config;
-- e:close() (or <close>) frees it. fp16 storage is refused: T5 v1.1's
-- activations overflow fp16 (transformers clamps them where it runs in
-- fp16); bf16 is what Black Forest Labs runs.
t5.encoder = public(function(o)
  o = o or {}
  if o.storage == "fp16" or o.precision == "fp16" then
    fail("t5.encoder: fp16 storage overflows T5 v1.1's activations; use fp32 or bf16")
  end
  for _, e in ipairs{{"storage", "fp32", "bf16"}, {"precision", "no", "fp32", "bf16"}, {"frozen", "bf16", "fp8"}} do
    local v, ok = o[e[1]], o[e[1]] == nil
    for i = 2, #e do ok = ok or v == e[i] end
    if not ok then fail("t5.encoder: %s must be %s, got '%s'", e[1], table.concat(e, " or ", 2), tostring(v)) end
  end
  local d = o.weights
  if type(d) == "string" then d = open(d, {prefix = o.prefix, config = o.config}) end
  local c = d and d.config or config(o.config or "t5-tiny")
  local g = ck.graph()
  local enc, r = build(g, c, {batch = o.batch, tokens = o.tokens, mask = o.mask})
  local p = g:compile{outputs = {r.last_hidden_state}, optimizer = "none", seed = o.seed or 1, storage = o.storage,
                      precision = o.precision, frozen = o.frozen, device = o.device}
  if d then load(p, enc, d) end
  return setmetatable({program = p, enc = enc, config = c, output = r.last_hidden_state}, Program)
end)

-- e:encode(ids [, mask]) -> last_hidden_state [B, L, d_model] as a ck.array
function Program:encode(ids, mask)
  if not self.program then error("t5: this encoder is closed", 2) end
  feed(self.enc, self.program, ids, mask, 3)
  self.program:forward()
  return self.program:array(self.output)
end

function Program:close()
  if self.program then
    local closing <close> = self.program
    self.program = nil
  end
end

return t5

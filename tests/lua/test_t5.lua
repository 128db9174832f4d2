-- ck.t5, T5 v1.1's encoder: a small random T5EncoderModel (tests/ref/make_t5_ref.py)
-- loaded from a sharded text_encoder_2/ folder and from fp16, bf16 and fp8 single
-- files gives transformers' last_hidden_state within 1e-4, with and without the
-- attention mask; the relative position buckets are transformers' at every
-- distance; the t5-xxl config's parameters are transformers' keys and shapes;
-- bad configs, files, ids and masks are one line naming what is wrong.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local t5 = require "ck.t5"

local DATA = "tests/data/t5/"
local ref <close> = ck.safetensors(DATA .. "outputs.safetensors")
local B, L = 3, 40

local tmp = string.format("out/test_t5.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))
local made = {}
local function path(name)
  made[#made + 1] = tmp .. "/" .. name
  return tmp .. "/" .. name
end

-- max over elements of |got - want| / max(1, |want|)
local function err(got, want)
  if #got ~= #want then return math.huge end
  local e = 0
  for i = 1, #want do
    local d = math.abs(got[i] - want[i]) / math.max(1, math.abs(want[i]))
    if not (d <= e) then e = d end -- NaN counts as the worst
  end
  return e
end

local function matches(h, key, what, tol)
  tol = tol or 1e-4
  local e = err(h:table(), ref:read(key))
  T.ok(e <= tol, string.format("%s equals transformers' %s within %g (rel err %.2e)", what, key, tol, e))
end

local function raises(what, pattern, f, ...)
  local ok, e = pcall(f, ...)
  T.ok(not ok and tostring(e):find(pattern, 1, true) ~= nil, what .. ": " .. tostring(e))
end

do -- the buckets: transformers' _relative_position_bucket at every distance from -1100 to 1100
  for _, e in ipairs{{"buckets_32_128", 32, 128, "t5-v1_1-xxl's 32 buckets, distance 128"},
                     {"buckets_16_20", 16, 20, "the reference's 16 buckets, distance 20"}} do
    local want, bad = ref:read(e[1]), nil
    for i = 1, #want do
      local rel = i - 1101
      if not bad and t5.relative_position_bucket(rel, e[2], e[3]) ~= want[i] then bad = rel end
    end
    T.ok(#want == 2201 and bad == nil, string.format("%s: every bucket is transformers'%s", e[4],
      bad and string.format(" but at %d (%d, not %d)", bad, t5.relative_position_bucket(bad, e[2], e[3]),
      want[bad + 1101]) or ""))
  end
  local c = t5.config("t5-xxl")
  local a, want, same = t5.position_buckets(4, c):table(), {0, 17, 18, 19, 1, 0, 17, 18, 2, 1, 0, 17, 3, 2, 1, 0}, true
  for i = 1, 16 do same = same and a[i] == want[i] end
  T.ok(#a == 16 and same,
    "position_buckets(4): row i, column j holds the bucket of j - i (keys after the query in the upper half)")
end

local d = t5.open(DATA .. "text_encoder_2")
local cfg = d.config

do -- the folder: config.json read and checked, the shards' keys mapped
  T.ok(d.kind == "folder" and d.file == DATA .. "text_encoder_2/model.safetensors.index.json" and #d.files == 4,
    "text_encoder_2/ opens as a folder of 4 shards named by model.safetensors.index.json")
  T.ok(cfg.d_model == 32 and cfg.d_kv == 6 and cfg.num_heads == 4 and cfg.d_ff == 48 and cfg.num_layers == 3
    and cfg.relative_attention_num_buckets == 16 and cfg.relative_attention_max_distance == 20 and cfg.feed_forward_proj == "gated-gelu",
    "config.json: d_model 32, 4 heads of 6, d_ff 48, 3 layers, 16 buckets to 20, gated-gelu (tanh)")
  T.ok(type(d.map["shared.weight"]) == "table" and d.map["shared.weight"].key == "shared.weight",
    "shared.weight maps to its shard's key")
  local root = t5.open(DATA)
  T.ok(root.file == d.file, "a Flux folder itself opens its text_encoder_2/")
end

local function run(opts, ids, mask)
  local e <close> = t5.encoder(opts)
  return e:encode(ids, mask), e
end

local ids, mask = ref:read("ids"), ref:read("mask")

do -- no mask: pads are attended (Black Forest Labs' use)
  local h = run({weights = d, batch = B, tokens = L}, ids)
  T.ok(table.concat(h.shape, ",") == "3,40,32", "last_hidden_state is [3, 40, 32]")
  matches(h, "last_hidden_state", "the sharded fp32 folder, no mask")
end

do -- the mask: padded keys' weights exactly 0, the unpadded row bitwise as without
  local g = ck.graph()
  local enc, r = t5.build(g, cfg, {batch = B, tokens = L, mask = true})
  local w = enc.blocks[2].attn.SelfAttention.weights
  local p = g:compile{outputs = {r.last_hidden_state, w}, optimizer = "none"}
  t5.load(p, enc, d)
  enc:feed(p, ids, mask)
  p:forward()
  local h = p:array(r.last_hidden_state)
  matches(h, "last_hidden_state_masked", "with the attention mask (kohya's --apply_t5_attn_mask)")
  local v = p:get(w) -- [3, 4, 40, 40], block 1
  local nonzero, worst = 0, 0
  for row = 0, B * 4 * L - 1 do
    local b, s = row // (4 * L), 0
    for j = 0, L - 1 do
      local x = v[row * L + j + 1]
      if mask[b * L + j + 1] == 0 and x ~= 0 then nonzero = nonzero + 1 end
      s = s + x
    end
    worst = math.max(worst, math.abs(s - 1))
  end
  T.ok(nonzero == 0 and worst < 1e-5, string.format("block 1's weights at padded keys are exactly 0 (%d are not); "
    .. "rows sum to 1 within %.1e", nonzero, worst))
  local plain = run({weights = d, batch = B, tokens = L}, ids):table()
  local got, same = h:table(), true
  for i = 1, L * 32 do same = same and got[i] == plain[i] end
  T.ok(same, "row 1 (no pads) is bitwise the same with its all-ones mask as without a mask")
end

do -- files in other dtypes: fp16 (both embedding keys), bf16 (encoder.embed_tokens alone), fp8 e4m3fn
  for _, e in ipairs{{"fp16", "t5_fp16.safetensors"}, {"bf16", "t5_bf16.safetensors"},
                     {"fp8", "t5_fp8_e4m3fn.safetensors"}} do
    local h = run({weights = t5.open(DATA .. e[2], {config = cfg}), batch = B, tokens = L}, ids)
    matches(h, "last_hidden_state_" .. e[1], e[2] .. " loaded into fp32")
  end
  local fp8 = t5.open(DATA .. "t5_fp8_e4m3fn.safetensors", {config = cfg})
  local a = run({weights = fp8, batch = B, tokens = L}, ids):table()
  local b = run({weights = fp8, batch = B, tokens = L, frozen = "fp8"}, ids):table()
  local same = #a == #b
  for i = 1, #a do same = same and a[i] == b[i] end
  T.ok(same, "the fp8 file held in fp8 (frozen = \"fp8\") gives the fp32 run's output bitwise")
  -- bf16 storage: as far from fp32 as transformers' own bf16 run is (relative to the output's norm)
  local function rel_norm(got, want)
    local dd, nn = 0, 0
    for i = 1, #want do dd, nn = dd + (got[i] - want[i]) ^ 2, nn + want[i] ^ 2 end
    return math.sqrt(dd / nn)
  end
  local want = ref:read("last_hidden_state")
  local ours = rel_norm(run({weights = d, batch = B, tokens = L, storage = "bf16"}, ids):table(), want)
  local theirs = rel_norm(ref:read("last_hidden_state_hf_bf16"), want)
  T.ok(ours <= 1.5 * theirs, string.format("bf16 storage: %.3f of the output's norm from fp32, transformers' bf16 run "
    .. "%.3f", ours, theirs))
  local c16 = t5.open(DATA .. "t5_fp16.safetensors").config
  T.ok(c16.d_model == 32 and c16.d_kv == 6 and c16.num_heads == 4 and c16.d_ff == 48 and c16.num_layers == 3
    and c16.vocab_size == 512 and c16.relative_attention_num_buckets == 16
    and c16.relative_attention_max_distance == 128,
    "a single file without a config: the counts from its shapes, max distance T5 v1.1's 128 (no tensor holds it)")
end

do -- a file holding other models too (ComfyUI's all-in-one checkpoints): the keys under a prefix
  local f <close> = ck.safetensors(DATA .. "t5_bf16.safetensors")
  local P = "text_encoders.t5xxl.transformer."
  local entries = {{"model.diffusion_model.img_in.weight", {2, 2}, {1, 2, 3, 4}}}
  for _, k in ipairs(f:keys()) do entries[#entries + 1] = {P .. k, f:shape(k), f:read(k)} end
  ck.write_safetensors(path("all_in_one.safetensors"), entries, nil, "BF16")
  local h = run({weights = t5.open(tmp .. "/all_in_one.safetensors", {prefix = P, config = cfg}), batch = B,
                 tokens = L}, ids)
  matches(h, "last_hidden_state_bf16", "the encoder under " .. P .. " in a file with other models' keys")
  -- a folder whose weights are the fp16 variant alone
  assert(ck.mkdir(tmp .. "/variant"))
  local g <close> = ck.safetensors(DATA .. "t5_fp16.safetensors")
  entries = {}
  for _, k in ipairs(g:keys()) do entries[#entries + 1] = {k, g:shape(k), g:read(k)} end
  ck.write_safetensors(path("variant/model.fp16.safetensors"), entries, nil, "F16")
  local j = io.open(path("variant/config.json"), "w")
  j:write(io.open(DATA .. "text_encoder_2/config.json"):read("a"))
  j:close()
  matches(run({weights = tmp .. "/variant", batch = B, tokens = L}, ids), "last_hidden_state_fp16",
    "a folder holding model.fp16.safetensors alone")
end

do -- 7 tokens: a table of buckets for another length
  local h = run({weights = d, batch = 2, tokens = 7}, ref:read("ids_short"))
  matches(h, "last_hidden_state_short", "7 tokens")
end

do -- the t5-xxl config: transformers' keys and shapes, 4,762,310,656 parameters
  local want, n, numel = {}, 0, 0
  for line in io.lines(DATA .. "t5_xxl_keys.txt") do
    local name, shape = line:match("^(%S+)%s+%[([%d,]*)%]%s*$")
    want[name], n = shape, n + 1
    local m = 1
    for x in shape:gmatch("%d+") do m = m * tonumber(x) end
    numel = numel + m
  end
  local g = ck.graph()
  local enc = t5.build(g, "t5-xxl", {tokens = 512})
  local diffs, have = {}, 0
  for _, prm in ipairs(g:params()) do
    have = have + 1
    local s = table.concat(prm.shape, ",")
    if want[prm.name] ~= s and #diffs < 3 then diffs[#diffs + 1] = prm.name .. " [" .. s .. "]" end
    if prm.kind ~= "frozen" and #diffs < 3 then diffs[#diffs + 1] = prm.name .. " is not frozen" end
  end
  local total = g:param_count()
  T.ok(#diffs == 0 and have == n and total == numel and total == 4762310656 and #enc.param_names == n,
    string.format("t5-xxl: %d frozen parameters in %d tensors, as transformers' T5EncoderModel (%d in %d)%s", total,
      have, numel, n, #diffs > 0 and ": " .. table.concat(diffs, ", ") or ""))
  local names = t5.parameter_names("t5-xxl")
  local all = true
  for name, s in pairs(names) do all = all and want[name] == table.concat(s, ",") end
  T.ok(all, "t5.parameter_names(\"t5-xxl\") lists the same keys and shapes")
end

do -- t5-tiny without weights: random, seeded
  local a = run({batch = 1, tokens = 5}, {{3, 4, 5, 1, 0}}):table()
  local b = run({batch = 1, tokens = 5}, {{3, 4, 5, 1, 0}}):table()
  T.ok(#a == 5 * 32 and a[1] == b[1] and a[#a] == b[#b], "t5-tiny with random weights: [1, 5, 32], the same each time")
end

---- bad input

do -- configs
  raises("an unknown config name", "unknown config 't5-base'", t5.config, "t5-base")
  raises("a relu T5 (v1.0)", "key 'feed_forward_proj' is relu; ck.t5 builds T5 v1.1's gated GELU", t5.config, {})
  raises("a count that is not a whole number", "key 'd_kv' must be a whole number >= 1, got 6.5", t5.config,
    {feed_forward_proj = "gated-gelu", d_kv = 6.5})
  raises("a negative count", "key 'num_heads' must be a whole number >= 1, got -4", t5.config,
    {feed_forward_proj = "gated-gelu", num_heads = -4})
  raises("a string epsilon", "key 'layer_norm_epsilon' must be a number between 0 and 1, got 1e-6", t5.config,
    {feed_forward_proj = "gated-gelu", layer_norm_epsilon = "1e-6"})
  raises("another model type", "key 'model_type' is umt5", t5.config,
    {feed_forward_proj = "gated-gelu", model_type = "umt5"})
  raises("a max distance inside the exact buckets", "key 'relative_attention_max_distance' (8) must exceed", t5.config,
    {feed_forward_proj = "gated-gelu", relative_attention_max_distance = 8})

  -- a folder whose config.json is bad: one line naming the file and the key
  local dir = tmp .. "/te"
  assert(ck.mkdir(dir))
  local f <close> = ck.safetensors(DATA .. "t5_fp16.safetensors")
  local entries = {}
  for _, k in ipairs(f:keys()) do entries[#entries + 1] = {k, f:shape(k), f:read(k)} end
  ck.write_safetensors(path("te/model.safetensors"), entries)
  local j = io.open(path("te/config.json"), "w")
  j:write('{"model_type": "t5", "feed_forward_proj": "gated-gelu", "d_model": 32, "d_kv": 6, "d_ff": 48, '
    .. '"num_layers": 3, "num_heads": 4, "vocab_size": 512, "relative_attention_num_buckets": 16, '
    .. '"relative_attention_max_distance": 20, "layer_norm_epsilon": -1}')
  j:close()
  raises("a folder's config.json with a negative epsilon names the file",
    dir .. "/config.json: key 'layer_norm_epsilon' must be a number between 0 and 1, got -1", t5.open, dir)
  j = io.open(path("te/config.json"), "w")
  j:write('{"model_type": "t5", "feed_forward_proj": "gated-gelu", "d_model": 32, "d_kv": 8, "d_ff": 48, '
    .. '"num_layers": 3, "num_heads": 4, "vocab_size": 512, "relative_attention_num_buckets": 16, '
    .. '"relative_attention_max_distance": 20}')
  j:close()
  raises("weights that do not fit the folder's config", dir .. "/model.safetensors: tensor "
    .. "'encoder.block.0.layer.0.SelfAttention.k.weight' has shape [24, 32]; the encoder of this config has [32, 32]",
    t5.open, dir)
  local ok, e = pcall(function() local r = t5.open(dir); return r end)
  T.ok(not ok and e:match("test_t5%.lua:%d+: " .. dir:gsub("%p", "%%%0")),
    "t5.open's errors name the caller's line: " .. tostring(e))
end

do -- files
  local f <close> = ck.safetensors(DATA .. "t5_fp16.safetensors")
  local function variant(name, edit)
    local entries = {}
    for _, k in ipairs(f:keys()) do
      local e = edit({k, f:shape(k), f:read(k)})
      if e then entries[#entries + 1] = e end
    end
    ck.write_safetensors(path(name), entries)
    return tmp .. "/" .. name
  end
  local function with(name, key, shape, values)
    local entries = {}
    for _, k in ipairs(f:keys()) do entries[#entries + 1] = {k, f:shape(k), f:read(k)} end
    entries[#entries + 1] = {key, shape, values}
    ck.write_safetensors(path(name), entries)
    return tmp .. "/" .. name
  end
  local dec = with("dec.safetensors", "decoder.block.0.layer.0.SelfAttention.q.weight", {24, 32}, ck.array({24, 32}, 0))
  raises("a decoder key", dec .. ": tensor 'decoder.block.0.layer.0.SelfAttention.q.weight' is no parameter of T5's "
    .. "encoder (T5's decoder", t5.open, dec, {config = cfg})
  local scaled = with("scaled.safetensors", "scaled_fp8", {1}, {0})
  raises("ComfyUI's scaled fp8 marker", "tensor 'scaled_fp8' is no parameter of T5's encoder (ComfyUI's scaled fp8",
    t5.open, scaled, {config = cfg})
  local odd = with("odd.safetensors", "encoder.block.3.layer.0.layer_norm.weight", {32}, ck.array({32}, 1))
  raises("a block past the config's layers", "tensor 'encoder.block.3.layer.0.layer_norm.weight' is no parameter",
    t5.open, odd, {config = cfg})
  local missing = variant("missing.safetensors", function(e)
    if e[1] ~= "encoder.block.2.layer.1.DenseReluDense.wo.weight" then return e end
  end)
  raises("a missing key", missing .. ": no tensor 'encoder.block.2.layer.1.DenseReluDense.wo.weight' (1 of the "
    .. "encoder's 30 missing)", t5.open, missing, {config = cfg})
  local noemb = variant("noemb.safetensors", function(e)
    if not e[1]:match("embed_tokens") and e[1] ~= "shared.weight" then return e end
  end)
  raises("no embeddings", "no tensor 'shared.weight' (nor encoder.embed_tokens.weight)", t5.open, noemb, {config = cfg})
  local v10 = variant("v10.safetensors", function(e)
    if e[1] == "encoder.block.0.layer.1.DenseReluDense.wi_0.weight" then
      return {"encoder.block.0.layer.1.DenseReluDense.wi.weight", e[2], e[3]}
    end
    return e
  end)
  raises("a T5 v1.0 file, its config inferred", "(T5 v1.0's ReLU feed-forward", t5.open, v10)
  raises("no such file", tmp .. "/none.safetensors", t5.open, tmp .. "/none.safetensors")
  raises("a CLIP folder", "no config.json", t5.open, "tests/data/clip")
  raises("a CLIP file", "no 2-D tensor 'shared.weight': not a T5 encoder's file", t5.open,
    "tests/data/clip/text_encoder/model.safetensors")
  -- a sharded folder whose index names a file outside it
  local dir = tmp .. "/shards"
  assert(ck.mkdir(dir))
  local c = io.open(DATA .. "text_encoder_2/config.json"):read("a")
  local j = io.open(path("shards/config.json"), "w")
  j:write(c)
  j:close()
  j = io.open(path("shards/model.safetensors.index.json"), "w")
  j:write('{"metadata": {}, "weight_map": {"shared.weight": "../t5_fp16.safetensors"}}')
  j:close()
  raises("an index naming a file outside its folder",
    "weight_map entry 'shared.weight' must name a file of this folder", t5.open, dir)
end

do -- ids and masks
  local e <close> = t5.encoder{weights = d, batch = 2, tokens = 4, mask = true}
  local ok, m = pcall(function()
    local r = e:encode({{5, 6, 1, 0}, {5, 512, 1, 0}}, {{1, 1, 1, 0}, {1, 1, 1, 0}})
    return r
  end)
  T.ok(not ok and m:find("test_t5.lua:%d+: t5: ids row 2 position 2: 512 is not a token id %(0 to 511%)"),
    "an id past the vocabulary names the row, the position and the line: " .. tostring(m))
  ok, m = pcall(function()
    local r = e:encode({{5, 6, 1, 0}, {5, 6, 1, 0}}, {{1, 1, 1, 0}, {1, 1, 2, 0}})
    return r
  end)
  T.ok(not ok and m:find("test_t5.lua:%d+: t5: mask row 2 position 3: 2 is not 0 or 1"), "a mask that is not 0/1: "
    .. tostring(m))
  raises("a mask row that keeps nothing", "mask row 1 keeps no token", e.encode, e, {{5, 6, 1, 0}, {5, 6, 1, 0}},
    {{0, 0, 0, 0}, {1, 1, 1, 0}})
  raises("no mask for an encoder built with one", "built with a mask: give one", e.encode, e,
    {{5, 6, 1, 0}, {5, 6, 1, 0}})
  raises("a row too short", "ids row 1 has 3 entries, the encoder takes 4", e.encode, e, {{5, 6, 1}, {5, 6, 1, 0}},
    {{1, 1, 1, 0}, {1, 1, 1, 0}})
  local h = e:encode({{5, 6, 1, 0}, {7, 8, 9, 1}}, {{1, 1, 1, 0}, {1, 1, 1, 1}})
  T.ok(#h == 2 * 4 * 32, "the encoder runs again after refused input")
  e:close()
  raises("a closed encoder", "this encoder is closed", e.encode, e, {{5, 6, 1, 0}, {7, 8, 9, 1}})
  raises("fp16 storage", "fp16 storage overflows T5 v1.1's activations", t5.encoder, {storage = "fp16"})
  raises("an unknown frozen storage", "t5.encoder: frozen must be bf16 or fp8, got 'fp4'", t5.encoder, {frozen = "fp4"})
  local plain <close> = t5.encoder{batch = 1, tokens = 2}
  raises("a mask for an encoder built without one", "a mask for an encoder built without one", plain.encode, plain,
    {{1, 0}}, {{1, 0}})
end

for i = #made, 1, -1 do os.remove(made[i]) end
os.remove(tmp .. "/te")
os.remove(tmp .. "/shards")
os.remove(tmp .. "/variant")
os.remove(tmp)
T.done()

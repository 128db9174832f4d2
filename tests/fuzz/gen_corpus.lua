-- Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/): small
-- valid safetensors files and near-valid ones, one per way of being wrong;
-- dataset samples in the shapes tests/fuzz/fuzz_dataset.c expects, and their
-- near misses. Scripts are kept by hand in corpus/script. Run from the source
-- root with a stock lua5.4: lua5.4 tests/fuzz/gen_corpus.lua
local dir = "tests/fuzz/corpus/"

local function put(path, s)
  local f = assert(io.open(dir .. path, "wb"))
  f:write(s)
  f:close()
end

local packers = {
  F32 = function(v) return string.pack("<f", v) end,
  F64 = function(v) return string.pack("<d", v) end,
  F16 = function(v) -- exact for the small integers and halves used here
    if v ~= v then return "\0\126" end
    if v == 0 then return "\0\0" end
    local s = v < 0 and 0x8000 or 0
    v = math.abs(v)
    local e = math.floor(math.log(v, 2))
    local m = math.floor((v / 2 ^ e - 1) * 1024 + 0.5)
    return string.pack("<I2", s | (e + 15) << 10 | m)
  end,
  BF16 = function(v) return string.pack("<f", v):sub(3, 4) end,
  I64 = function(v) return string.pack("<i8", math.floor(v)) end,
  I32 = function(v) return string.pack("<i4", math.floor(v)) end,
  I16 = function(v) return string.pack("<i2", math.floor(v)) end,
  I8 = function(v) return string.pack("<i1", math.floor(v) % 128) end,
  U8 = function(v) return string.pack("<I1", math.floor(v) % 256) end,
  BOOL = function(v) return v ~= 0 and "\1" or "\0" end,
  F8_E4M3 = function(v) -- exact for the halves used here
    if v == 0 then return "\0" end
    local e = math.floor(math.log(math.abs(v), 2))
    local m = math.floor((math.abs(v) / 2 ^ e - 1) * 8 + 0.5)
    return string.pack("<I1", (v < 0 and 0x80 or 0) | (e + 7) << 3 | m)
  end,
}
packers.F8_E5M2 = function(v) return packers.F16(v):sub(2, 2) end -- an fp16's high byte

local function numel(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

local function values(dtype, shape, fillv)
  local t = {}
  for i = 1, numel(shape) do t[i] = packers[dtype](fillv or ((i % 7) - 3) / 2) end
  return table.concat(t)
end

-- tensors: list of {name, dtype, shape, bytes (optional)}; meta: list of {k, v} (raw JSON text)
local function st(tensors, meta, o)
  o = o or {}
  local parts, data, off = {}, {}, 0
  if meta then
    local m = {}
    for _, kv in ipairs(meta) do m[#m + 1] = '"' .. kv[1] .. '":"' .. kv[2] .. '"' end
    parts[1] = '"__metadata__":{' .. table.concat(m, ",") .. "}"
  end
  for _, t in ipairs(tensors) do
    local bytes = t[4] or values(t[2], t[3])
    local shape = {}
    for i, d in ipairs(t[3]) do shape[i] = tostring(d) end
    parts[#parts + 1] = string.format('"%s":{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}', t[1], t[2],
      table.concat(shape, ","), off, off + #bytes)
    off = off + #bytes
    data[#data + 1] = bytes
  end
  local header = "{" .. table.concat(parts, ",") .. "}"
  header = header .. string.rep(" ", (8 - #header % 8) % 8)
  return string.pack("<I8", #header) .. header .. table.concat(data)
end

local function raw_header(h, data)
  return string.pack("<I8", #h) .. h .. (data or "")
end

-- the safetensors reader
local one = st({{"w", "F32", {2, 3}}})
put("safetensors/valid_empty", st({}))
put("safetensors/valid_f32", one)
put("safetensors/valid_every_dtype", st({
  {"a.f64", "F64", {2}}, {"b.f32", "F32", {2, 2}}, {"c.f16", "F16", {3}}, {"d.bf16", "BF16", {3}},
  {"e.i64", "I64", {1}}, {"f.i32", "I32", {2}}, {"g.i16", "I16", {2}}, {"h.i8", "I8", {4}},
  {"i.u8", "U8", {4}}, {"j.bool", "BOOL", {3}}, {"k.f8", "F8_E4M3", {5}}, {"l.f8", "F8_E5M2", {2, 2}},
}))
put("safetensors/valid_scalar_and_empty", st({{"s", "F32", {}}, {"z", "F32", {0, 4}}, {"y", "F16", {2, 0, 3}}}))
put("safetensors/valid_metadata", st({{"w", "BF16", {2, 2}}},
  {{"format", "pt"}, {"note", "caf\\u00e9 \\ud83d\\ude00 \\\"q\\\" \\\\ \\n"}, {"empty", ""}}))
put("safetensors/valid_unicode_name", st({{"unet.down_blocks.0.\\u00e9", "F32", {1}}, {"\xe2\x82\xac", "F16", {1}}}))
put("safetensors/valid_8_dims", st({{"w", "U8", {1, 1, 1, 1, 1, 1, 2, 2}}}))
put("safetensors/bad_truncated_data", one:sub(1, #one - 4))
put("safetensors/bad_truncated_header", one:sub(1, 20))
put("safetensors/bad_short", "\8\0\0")
put("safetensors/bad_header_too_long", string.pack("<I8", 1 << 40) .. "{}")
put("safetensors/bad_trailing_bytes", one .. "xxxx")
put("safetensors/bad_offsets_overlap", raw_header(
  '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
  string.rep("\0", 12)))
put("safetensors/bad_offsets_gap", raw_header(
  '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}',
  string.rep("\0", 12)))
put("safetensors/bad_offsets_shape", raw_header('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', string.rep("\0", 8)))
put("safetensors/bad_offsets_reversed", raw_header('{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}', string.rep("\0", 4)))
put("safetensors/bad_huge_shape", raw_header(
  '{"a":{"dtype":"F64","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}}', string.rep("\0", 8)))
put("safetensors/bad_number_too_large", raw_header('{"a":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,1]}}', "\0"))
put("safetensors/bad_negative", raw_header('{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', "\0"))
put("safetensors/bad_fraction", raw_header('{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', "\0"))
put("safetensors/bad_leading_zero", raw_header('{"a":{"dtype":"U8","shape":[01],"data_offsets":[0,1]}}', "\0"))
put("safetensors/bad_nine_dims", raw_header('{"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}', "\0"))
put("safetensors/bad_unknown_dtype", raw_header('{"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}}', "\0"))
put("safetensors/bad_missing_field", raw_header('{"a":{"dtype":"U8","data_offsets":[0,1]}}', "\0"))
put("safetensors/bad_unknown_field", raw_header('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}', "\0"))
put("safetensors/bad_duplicate_name", raw_header(
  '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', "\0\0"))
put("safetensors/bad_duplicate_meta", raw_header('{"__metadata__":{"k":"1","k":"2"}}'))
put("safetensors/bad_meta_not_string", raw_header('{"__metadata__":{"k":1}}'))
put("safetensors/bad_not_utf8", raw_header('{"\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', "\0"))
put("safetensors/bad_overlong_utf8", raw_header('{"\xc0\xaf":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', "\0"))
put("safetensors/bad_lone_surrogate", raw_header('{"\\ud800x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', "\0"))
put("safetensors/bad_nul_escape", raw_header('{"a\\u0000":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', "\0"))
put("safetensors/bad_control_byte", raw_header('{"a\1":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', "\0"))
put("safetensors/bad_unterminated", raw_header('{"a'))
put("safetensors/bad_after_object", raw_header('{} {}'))
put("safetensors/bad_not_object", raw_header('[1,2]'))
put("safetensors/bad_entry_not_object", raw_header('{"a":[0,1]}'))

-- dataset samples (latents [4, 8, 8], prompt_embeds [8, 16], pooled [16], time_ids [6])
local function sample(o)
  o = o or {}
  local dt = o.dtype or "F32"
  local t = {
    {"latents", o.latent_dtype or dt, o.latents or {4, 8, 8}, o.latent_bytes},
    {"prompt_embeds", dt, o.prompt or {8, 16}},
    {"pooled_prompt_embeds", dt, {16}},
    {"time_ids", dt, {6}, values(dt, {6}, 64)},
  }
  if o.noise then t[#t + 1] = {"noise", dt, {4, 8, 8}} end
  if o.timesteps then t[#t + 1] = {"timesteps", o.timesteps, {1}, values(o.timesteps, {1}, 500)} end
  if o.drop then table.remove(t, o.drop) end
  return st(t, o.meta)
end
put("dataset/valid_f32", sample())
put("dataset/valid_f16", sample{dtype = "F16"})
put("dataset/valid_bf16_noise_timesteps", sample{dtype = "BF16", noise = true, timesteps = "F32"})
put("dataset/valid_f32_noise", sample{noise = true, meta = {{"source", "fuzz seed"}}})
put("dataset/bad_latents_shape", sample{dtype = "F16", latents = {4, 4, 4}})
put("dataset/bad_prompt_shape", sample{dtype = "F16", prompt = {77, 16}})
put("dataset/bad_latents_i32", sample{dtype = "F16", latent_dtype = "I32"})
put("dataset/bad_latents_nan", sample{dtype = "F16", latent_bytes = values("F16", {4, 8, 8}, 0 / 0)})
put("dataset/bad_missing_pooled", sample{dtype = "F16", drop = 3})
put("dataset/bad_timesteps_i64", sample{dtype = "F16", timesteps = "I64"})
local s = sample{dtype = "F16"}
put("dataset/bad_truncated", s:sub(1, #s - 100))
put("dataset/bad_not_safetensors", "latents 4x8x8\n")
print("corpus written under " .. dir)

-- Fixtures for the bad-input catalogue (tests/sh/test_bad_inputs.sh runs this
-- in its work directory first): a valid output file to protect, malformed
-- safetensors files, and small datasets for scripts/train_sdxl_lora.lua at
-- --resolution 64 (latents [4, 8, 8]) with NaN, misshaped and I32 samples.
local ck = require "ck"

local function f32(values)
  local t = {}
  for i, v in ipairs(values) do t[i] = string.pack("<f", v) end
  return table.concat(t)
end

-- a safetensors file written byte by byte: {name, dtype, shape, bytes}
local function raw(path, tensors)
  local parts, data, off = {}, {}, 0
  for _, t in ipairs(tensors) do
    parts[#parts + 1] = string.format('"%s":{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}', t[1], t[2],
      table.concat(t[3], ","), off, off + #t[4])
    off = off + #t[4]
    data[#data + 1] = t[4]
  end
  local header = "{" .. table.concat(parts, ",") .. "}"
  header = header .. string.rep(" ", (8 - #header % 8) % 8)
  local f = assert(io.open(path, "wb"))
  f:write(string.pack("<I8", #header), header, table.concat(data))
  f:close()
end

local function bytes_of(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function write_bytes(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local function fill(n, v)
  local t = {}
  for i = 1, n do t[i] = v or (i % 7) / 7 end
  return t
end

ck.write_safetensors("keep.safetensors", {{"w", {2, 3}, {1, 2, 3, 4, 5, 6}}}, {note = "the output to protect"})
ck.write_safetensors("good.safetensors", {{"w", {2, 3}, {1, 2, 3, 4, 5, 6}}})
ck.write_safetensors("big.safetensors", {{"w", {2, 3}, {1, 2, 3, 4, 5, 1000}}})
local good = bytes_of("good.safetensors")
write_bytes("truncated.safetensors", good:sub(1, #good - 8))
write_bytes("header_cut.safetensors", good:sub(1, 20))
write_bytes("empty.safetensors", "")
write_bytes("garbage.safetensors", string.pack("<I8", 24) .. "this is not json at all!")
write_bytes("huge_header.safetensors", string.pack("<I8", 1000000) .. "{}")
raw("i32.safetensors", {{"w", "I32", {2, 3}, string.rep(string.pack("<i4", 7), 6)}})
raw("offsets.safetensors", {{"w", "F32", {2, 3}, f32(fill(5))}})

-- datasets: two samples each (the batch of sdxl-tiny is 2)
local function sample(path, latents, latent_dtype)
  local t = {
    {"latents", latent_dtype or "F32", latents, nil},
    {"prompt_embeds", "F32", {77, 64}, f32(fill(77 * 64))},
    {"pooled_prompt_embeds", "F32", {64}, f32(fill(64))},
    {"time_ids", "F32", {6}, f32({64, 64, 0, 0, 64, 64})},
  }
  local n = 1
  for _, d in ipairs(latents) do n = n * d end
  if latent_dtype == "I32" then t[1][4] = string.rep(string.pack("<i4", 1), n)
  else t[1][4] = f32(fill(n, latent_dtype == "nan" and 0 / 0 or nil)) ; t[1][2] = "F32" end
  raw(path, t)
end
for _, d in ipairs({"nan_data", "wrong_data", "i32_data"}) do assert(ck.mkdir(d)) end
for i = 1, 2 do
  sample(string.format("nan_data/%06d.safetensors", i), {4, 8, 8}, "nan")
  sample(string.format("wrong_data/%06d.safetensors", i), {4, 16, 16})
  sample(string.format("i32_data/%06d.safetensors", i), {4, 8, 8}, "I32")
end
print("fixtures written")

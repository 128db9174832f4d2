-- ck.encode: both text encoders as one program, captions to prompt_embeds
-- and pooled embeddings as diffusers' SDXL pipeline joins them, and kohya's
-- --max_token_length chunks joined as sd-scripts joins them; text programs at
-- several batch sizes share one copy of the weights.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local encode = require "ck.encode"

local one = encode.models{seed = 3}
local tp = encode.text_program(one, 2)
local caps = {"a red circle on a white background", "a green triangle"}
local pe, pooled = encode.encode_text(tp, one, caps)
T.ok(#pe == 2 * 77 * 64 and #pooled == 2 * 64, "two captions give prompt_embeds [2, 77, 64] and pooled [2, 64]")

-- one caption at batch 1 equals its row at batch 2 to fp32 rounding: the
-- programs share the weights (bitwise on most BLAS kernels; OpenBLAS's
-- AVX-512 kernels for small matrices round by the row count, a few ulp;
-- weights not shared, or rows mixed up, differ by far more)
local function close(a, b, n, ao, bo)
  local worst, most = 0, 0
  for i = 1, n do
    worst = math.max(worst, math.abs(a[(ao or 0) + i] - b[(bo or 0) + i]))
    most = math.max(most, math.abs(b[(bo or 0) + i]))
  end
  return worst <= 1e-6 * math.max(1, most), worst
end
local tp1 = encode.text_program(one, 1, tp.program)
local pe1, pooled1 = encode.encode_text(tp1, one, {caps[2]})
local ok1, w1 = close(pe1, pe, 77 * 64, 0, 77 * 64)
local ok2, w2 = close(pooled1, pooled, 64, 0, 64)
T.ok(ok1 and ok2, string.format("a caption encoded at batch 1 (sharing the batch-2 program's weights) equals its row " ..
  "at batch 2 to fp32 rounding (worst %.3g, %.3g)", w1, w2))
T.ok(tp1.program:plan().group_id == tp.program:plan().group_id, "the two text programs are one group")

-- the concatenation: the first 768+1280 split is l's penultimate, then g's (tiny: 32 + 32)
local differs = false
for t = 0, 76 do
  for j = 1, 32 do differs = differs or pe1[t * 64 + j] ~= pe1[t * 64 + 32 + j] end
end
T.ok(differs, "prompt_embeds joins two different encoders' states")

-- kohya's chunks: a short caption's first 76 joined states are the plain encoding's
for _, n in ipairs{150, 225} do
  local m = encode.models{seed = 3, max_token_length = n}
  local k = n // 75
  T.ok(m.tokens == n + 2 and m.chunks == k, string.format("--max-token-length %d: %d tokens, %d chunks", n, n + 2, k))
  local tk = encode.text_program(m, 1)
  local pk, poolk = encode.encode_text(tk, m, {caps[2]})
  T.ok(#pk == (n + 2) * 64 and #poolk == 64, string.format("a caption gives prompt_embeds [%d, 64]", n + 2))
  local e1, x1 = close(pk, pe1, 76 * 64)
  local e2, x2 = close(poolk, pooled1, 64)
  T.ok(e1 and e2, string.format("a short caption's first 76 joined states and its pooled embedding are the plain " ..
    "encoding's, to fp32 rounding (worst %.3g, %.3g)", x1, x2))
  -- a long caption: more than 75 tokens reach the second chunk, so its states differ there
  local long = string.rep("a small red square beside a big blue circle, ", 12)
  local pl = encode.encode_text(tk, m, {long})
  local p77 = encode.encode_text(tp1, one, {long})
  local first_same, later_differ = true, false
  for i = 1, 76 * 64 do first_same = first_same and pl[i] == p77[i] end
  for i = 77 * 64 + 1, 150 * 64 do later_differ = later_differ or pl[i] ~= p77[(i - 1) % (77 * 64) + 1] end
  T.ok(first_same and later_differ, "a long caption's first chunk is its 77-token encoding; the next chunks hold the rest")
end

-- the tiny model's tokenizer is ckrun's built-in one (clip_tokenizer{tiny = true}): every caption tokenizes
local ids = one.tokenizer_l:encode("Émoji 🎉 and ünïcödé, 東京")
T.ok(#ids == 77 and ids[1] == one.tokenizer_l.bos, "the tiny tokenizer encodes any text to 77 ids")
T.ok(one.tokenizer_g:encode("a")[77] == 0 and one.tokenizer_l:encode("a")[77] == one.tokenizer_l.eos,
  "tokenizer_2 pads with '!' (0), tokenizer with <|endoftext|>")

-- a base model (a diffusers folder): its VAE and text encoders are loaded, not drawn
local ckpt = require "ck.checkpoint"
local desc = ckpt.open("tests/data/checkpoint/sdxl_tiny")
local based = encode.models{base = desc, seed = 3}
T.ok(based.tokens == based.text_l.max_position_embeddings, "the prompt's tokens are the encoders' positions (" ..
  based.tokens .. ")")
local tb = encode.text_program(based, 1)
local function equal_to_file(p, name, files, key)
  if type(files) == "string" then files = {files} end
  local b
  for _, file in ipairs(files) do
    local f <close> = ck.safetensors(file)
    if f:has(key) then b = f:read(key) end
  end
  local a = p:get(name)
  if not b then return false end
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end
local dir = "tests/data/checkpoint/sdxl_tiny/"
T.ok(equal_to_file(tb.program, "text_encoder.text_model.embeddings.token_embedding.weight",
  dir .. "text_encoder/model.safetensors", "text_model.embeddings.token_embedding.weight") and
  equal_to_file(tb.program, "text_encoder_2.text_projection.weight",
  {dir .. "text_encoder_2/model-00001-of-00002.safetensors", dir .. "text_encoder_2/model-00002-of-00002.safetensors"},
  "text_projection.weight"),
  "the text program holds the folder's text encoders' weights")
local vp = encode.vae_program(based, 64, 64)
T.ok(equal_to_file(vp.program, "encoder.conv_in.weight", dir .. "vae/diffusion_pytorch_model.safetensors",
  "encoder.conv_in.weight"), "the VAE program holds the folder's VAE weights")

T.done()

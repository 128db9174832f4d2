-- The tokenizer of Flux.1's T5-XXL text encoder (ck.t5_tokenizer: T5's
-- sentencepiece unigram tokenizer as transformers 5's T5Tokenizer runs it),
-- and the frames Flux's pipelines feed the encoder: --t5xxl-max-token-length
-- ids (512 for dev, 256 for schnell), truncated with </s> last, padded with
-- <pad>, and the attention mask that --apply-t5-attn-mask uses.
--
--   local t5tok = require "ck.t5tok"
--   local tok = t5tok.load("FLUX.1-dev/tokenizer_2")   -- tokenizer.json or spiece.model
--   local ids, mask = t5tok.batch(tok, {"a cat", "a dog"}, t5tok.max_length.dev)
--   -- ids, mask: ck.arrays [2, 512] (whole numbers as floats)
local ck = require "ck"

local t5tok = {}

-- the sequence lengths of Flux's pipelines (diffusers' max_sequence_length,
-- kohya's --t5xxl_max_token_length defaults)
t5tok.max_length = {dev = 512, schnell = 256}

-- The tokenizer of path: a folder (tokenizer.json, else spiece.model, with
-- the token names of tokenizer_config.json or special_tokens_map.json) or
-- one of those files. opts: extra_ids, pad, eos, unk (ck.t5_tokenizer).
function t5tok.load(path, opts)
  return ck.t5_tokenizer(path, opts)
end

-- captions[1..B] framed to max_length: ids and mask as [B, max_length] arrays
function t5tok.batch(tok, captions, max_length)
  local ids, mask = {}, {}
  for b, text in ipairs(captions) do
    local row, m = tok:encode(text, {max_length = max_length})
    table.move(row, 1, max_length, (b - 1) * max_length + 1, ids)
    table.move(m, 1, max_length, (b - 1) * max_length + 1, mask)
  end
  local shape = {#captions, max_length}
  return ck.array(shape, ids), ck.array(shape, mask)
end

return t5tok

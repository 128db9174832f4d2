-- The by-hand check of ck.clip_tokenizer with the full CLIP vocabulary (run
-- once, not by ctest: the real files are not in the repository). After
--   /tmp/venv-tf4/bin/python tests/ref/make_tokenizer_ref.py --full-out /tmp/tok_full.json
-- (ids without ftfy) or
--   /tmp/venv-tf4/bin/python tests/ref/make_tokenizer_ref.py --ftfy --full-bpe GZ --full-out /tmp/tok_full.json
-- (the hard captions' ids with ftfy and without) run
--   ckrun --allow-read DIR_OF_GZ --allow-read /tmp tests/ref/full_vocab_check.lua \
--     --bpe .../open_clip/bpe_simple_vocab_16e6.txt.gz --ref /tmp/tok_full.json
-- It loads the real .txt.gz and the full folder the script wrote beside the
-- ids (/tmp/tok_full.json.d: vocab.json and merges.txt as CLIP builds them),
-- and counts the strings whose ids match the slow tokenizer's with each, for
-- each caption fix the file holds.
local ck = require "ck"
local f = assert(io.open(args.ref, "rb"))
local r = ck.json_decode(f:read("a"))
f:close()
local fixes = r.ftfy and {{"ftfy", r.ftfy}, {"none", r.none}} or {{"none", r.ids}}
for _, fix in ipairs(fixes) do
  local t0 = ck.now()
  local gz = ck.clip_tokenizer{bpe = args.bpe, caption_fix = fix[1]}
  local t1 = ck.now()
  local dir = ck.clip_tokenizer{dir = args.ref .. ".d", caption_fix = fix[1]}
  print(string.format("caption_fix %s: .txt.gz: vocab %d, bos %d, eos %d (loaded in %.3f s); folder: vocab %d, bos %d, eos %d",
    fix[1], gz.vocab_size, gz.bos, gz.eos, t1 - t0, dir.vocab_size, dir.bos, dir.eos))
  for _, which in ipairs{{".txt.gz", gz}, {"folder", dir}} do
    local t, good = which[2], 0
    for i, text in ipairs(r.texts) do
      local got, want = t:encode(text, {max_length = false}), fix[2][i]
      local ok = #got == #want + 2
      for j = 1, #want do ok = ok and got[j + 1] == want[j] end
      if ok then good = good + 1 else print(string.format("%s: MISMATCH %d %q", which[1], i, text)) end
    end
    print(string.format("caption_fix %s, %s: %d of %d strings match the slow tokenizer with the full vocabulary",
      fix[1], which[1], good, #r.texts))
  end
end

-- What ftfy's fix_text costs a caption: encodes plain tag captions and the
-- hard captions of tests/data/tokenizer/ftfy_cases.json with
-- caption_fix = "ftfy" and "none", and times loading the tokenizer.
--   ckrun --allow-read DIR bench/tokenizer.lua [--bpe DIR/bpe_simple_vocab_16e6.txt.gz] [--rounds N]
-- Without --bpe, the tests' small vocabulary (tests/data/tokenizer).
local ck = require "ck"
local rounds = tonumber(args.rounds) or 20
local src = args.bpe and {bpe = args.bpe} or {bpe = "tests/data/tokenizer/bpe_small.txt.gz"}

local f = assert(io.open("tests/data/tokenizer/ftfy_cases.json", "rb"))
local cases = ck.json_decode(f:read("a")).cases
f:close()
local hard, plain = {}, {}
for _, c in ipairs(cases) do if c.hard then hard[#hard + 1] = c.text end end
local tags = {"1girl", "solo", "long hair", "looking at viewer", "smile", "blue eyes", "outdoors", "sky", "cloud",
              "masterpiece", "best quality", "cherry blossoms", "school uniform", "upper body", "from side"}
for i = 1, #hard do
  local t = {}
  for j = 1, 12 do t[j] = tags[(i * 7 + j * 3) % #tags + 1] end
  plain[i] = table.concat(t, ", ")
end

for _, fix in ipairs{"none", "ftfy"} do
  local opts = {caption_fix = fix}
  for k, v in pairs(src) do opts[k] = v end
  local t0 = ck.now()
  local tok = ck.clip_tokenizer(opts)
  local load = ck.now() - t0
  for _, set in ipairs{{"plain tags", plain}, {"hard captions", hard}} do
    local bytes = 0
    for _, s in ipairs(set[2]) do bytes = bytes + #s end
    t0 = ck.now()
    for _ = 1, rounds do
      for _, s in ipairs(set[2]) do tok:encode(s) end
    end
    local dt = ck.now() - t0
    print(string.format("caption_fix %-4s %-13s %4d captions x %d: %7.1f us/caption, %6.2f MB/s (tokenizer loaded in %.3f s)",
      fix, set[1], #set[2], rounds, dt / (rounds * #set[2]) * 1e6, bytes * rounds / dt / 1e6, load))
  end
end

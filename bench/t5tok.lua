-- ck.t5_tokenizer's speed on the reference captions (tests/data/tokenizer/
-- t5_small): the time to load each form of the files, and captions per
-- second framed to 512 as Flux-dev feeds T5.
--   build/ckrun bench/t5tok.lua [--rounds 20]
local ck = require "ck"
local D = "tests/data/tokenizer/t5_small/"
local f = assert(io.open(D .. "cases.json", "rb"))
local ref = ck.json_decode(f:read("a"))
f:close()
local rounds = tonumber(args.rounds) or 20

for _, form in ipairs{"spiece", "json"} do
  local t0 = ck.now()
  local n = 20
  for _ = 1, n do ck.t5_tokenizer(D .. form) end
  print(string.format("load %-7s %8.2f ms", form, (ck.now() - t0) / n * 1e3))
end

local tok = ck.t5_tokenizer(D .. "spiece")
local texts, bytes = {}, 0
for _, c in ipairs(ref.cases) do
  if #c.text > 0 then texts[#texts + 1] = c.text bytes = bytes + #c.text end
end
local t0 = ck.now()
for _ = 1, rounds do
  for _, s in ipairs(texts) do tok:encode(s, {max_length = 512}) end
end
local dt = ck.now() - t0
local n = rounds * #texts
print(string.format("encode %d captions (%d bytes each on average): %.1f us a caption, %.0f captions/s, %.1f MB/s",
  n, bytes // #texts, dt / n * 1e6, n / dt, rounds * bytes / dt / 1e6))

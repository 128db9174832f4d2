-- ck.t5_tokenizer against transformers 5's T5Tokenizer, id for id:
-- tests/ref/make_t5_tokenizer_ref.py trained a small sentencepiece unigram
-- model with T5's settings and saved it as an spiece.model folder and as the
-- tokenizer.json folder transformers 5 writes; tests/data/tokenizer/
-- t5_small/cases.json holds the ids transformers gives for each test string
-- (unicode, whitespace runs, emoji, CJK, special tokens, long captions) and
-- the frames of 512, 256, 77, 16, 2 and 1 with their attention masks. Every
-- form of the files must give those ids. Bad files and arguments are one
-- error naming the file and this script's line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local t5tok = require "ck.t5tok"

local D = "tests/data/tokenizer/t5_small/"
local f = assert(io.open(D .. "cases.json", "rb"))
local ref = ck.json_decode(f:read("a"))
f:close()

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do
    if a[i] ~= b[i] then return false end
  end
  return true
end

local function show(t)
  local s = {}
  for i = 1, math.min(#t, 40) do s[i] = tostring(t[i]) end
  return "{" .. table.concat(s, " ") .. (#t > 40 and " ..." or "") .. "}"
end

-- every case through f(case) -> got, want (nil: skipped); the first mismatch is printed
local function all_cases(what, fn)
  local bad, n = nil, 0
  for i, c in ipairs(ref.cases) do
    local got, want = fn(c)
    if want ~= nil then
      n = n + 1
      if not same(got, want) then
        bad = string.format("case %d %q: got %s, want %s", i, c.text, show(got), show(want))
        break
      end
    end
  end
  T.ok(bad == nil and n > 0, string.format("%s: %d strings match%s", what, n, bad and (" -- " .. bad) or ""))
end

local sp = ck.t5_tokenizer(D .. "spiece")
local js = ck.t5_tokenizer(D .. "json")
local spf = ck.t5_tokenizer(D .. "spiece/spiece.model")
local jsf = ck.t5_tokenizer(D .. "json/tokenizer.json")

for name, t in pairs{["spiece.model folder"] = sp, ["tokenizer.json folder"] = js, ["spiece.model file"] = spf,
                     ["tokenizer.json file"] = jsf} do
  T.ok(t.vocab_size == ref.vocab_size and t.eos == ref.eos and t.pad == ref.pad and t.unk == ref.unk,
    string.format("%s: vocab %d (pieces and 100 extra ids), eos %d, pad %d, unk %d", name, t.vocab_size, t.eos, t.pad, t.unk))
end
T.ok(sp:piece(ref.extra_id_0) == "<extra_id_0>" and sp:piece(sp.vocab_size - 100) == "<extra_id_99>" and
  js:piece(ref.extra_id_0) == "<extra_id_0>", "the extra ids follow the pieces in reverse, <extra_id_0> last")
T.ok(sp:piece(sp.vocab_size) == nil and sp:piece(-1) == nil, "piece() is nil outside the vocabulary")

all_cases("spiece.model folder, ids with </s>", function(c) return (sp:encode(c.text)), c.ids end)
all_cases("tokenizer.json folder, ids with </s>", function(c) return (js:encode(c.text)), c.ids end)
all_cases("spiece.model given as a file", function(c) return (spf:encode(c.text)), c.ids end)
all_cases("tokenizer.json given as a file", function(c) return (jsf:encode(c.text)), c.ids end)

local nframes = 0
for _, c in ipairs(ref.cases) do nframes = nframes + (c.frames and #c.frames or 0) end
local function frames(t, what)
  all_cases(what .. ": frames (truncated, </s> last, padded)", function(c)
    if not c.frames then return end
    local got, want = {}, {}
    for _, fr in ipairs(c.frames) do
      local ids, mask = t:encode(c.text, {max_length = fr.max_length})
      table.move(ids, 1, #ids, #got + 1, got)
      table.move(mask, 1, #mask, #got + 1, got)
      table.move(fr.ids, 1, #fr.ids, #want + 1, want)
      table.move(fr.mask, 1, #fr.mask, #want + 1, want)
    end
    return got, want
  end)
end
frames(sp, "spiece.model")
frames(js, "tokenizer.json")
T.ok(nframes > 100, nframes .. " frames compared, among them captions longer than 512 tokens")

do
  local long
  for _, c in ipairs(ref.cases) do if #c.ids > 600 then long = c break end end
  local ids, mask = sp:encode(long.text, {max_length = 512})
  T.ok(#ids == 512 and ids[512] == sp.eos and ids[511] == long.ids[511] and mask[512] == 1,
    "a caption of " .. #long.ids .. " ids keeps its first 511 and ends in </s> at 512")
  local short = sp:encode("a cat", {max_length = 16, pad = false})
  local padded, pmask = sp:encode("a cat", {max_length = 16})
  T.ok(#short < 16 and short[#short] == sp.eos and #padded == 16 and padded[16] == sp.pad and pmask[#short] == 1 and
    pmask[#short + 1] == 0, "pad = false stops at </s>; padding appends <pad> with mask 0")
  local all = sp:encode(long.text, {max_length = false})
  T.ok(same(all, long.ids), "max_length = false: every id, no truncation")
end

-- transformers 5 takes only the vocabulary and the character map from a
-- tokenizer.json: transformers 4's normalizer and pre-tokenizer (Strip,
-- Replace, Metaspace alone) change nothing (the reference script checked
-- that transformers gives these ids for such a file too)
do
  local jf = assert(io.open(D .. "json/tokenizer.json", "rb"))
  local tj = ck.json_decode(jf:read("a"))
  jf:close()
  tj.normalizer = {type = "Sequence", normalizers = {tj.normalizer, {type = "Strip", strip_left = false, strip_right = true},
    {type = "Replace", pattern = {Regex = " {2,}"}, content = "\u{2581}"}}}
  tj.pre_tokenizer = {type = "Metaspace", replacement = "\u{2581}", prepend_scheme = "always", split = true}
  local path = "t5tok_test_v4.json"
  local out = assert(io.open(path, "wb"))
  out:write(ck.json_encode(tj))
  out:close()
  local v4 = ck.t5_tokenizer(path)
  os.remove(path)
  all_cases("a tokenizer.json with transformers 4's normalizer and pre-tokenizer", function(c) return (v4:encode(c.text)), c.ids end)
end

-- ck.t5tok: a folder's tokenizer, batches as arrays
do
  local tok = t5tok.load(D .. "json")
  local texts = {ref.cases[7].text, ref.cases[8].text, ""}
  local ids, mask = t5tok.batch(tok, texts, 16)
  local ok = ids.shape[1] == 3 and ids.shape[2] == 16 and mask.shape[1] == 3 and mask.shape[2] == 16
  for b = 1, 3 do
    local want, wmask = tok:encode(texts[b], {max_length = 16})
    for i = 1, 16 do
      ok = ok and ids:get((b - 1) * 16 + i) == want[i] and mask:get((b - 1) * 16 + i) == wmask[i]
    end
  end
  T.ok(ok, "t5tok.batch: [3, 16] arrays of ids and mask, row b the frame of caption b")
  T.ok(t5tok.max_length.dev == 512 and t5tok.max_length.schnell == 256, "t5tok.max_length: dev 512, schnell 256")
  local okl, e = pcall(t5tok.load, "tests/data/tokenizer")
  T.ok(not okl and e:find("test_t5tok.lua:%d+: t5_tokenizer: 'tests/data/tokenizer' holds neither tokenizer.json nor spiece.model"),
    "a folder without a T5 tokenizer is one line naming it: " .. tostring(e))
end

-- options
do
  local t = ck.t5_tokenizer(D .. "spiece/spiece.model", {extra_ids = 3, pad = "</s>"})
  T.ok(t.vocab_size == ref.vocab_size - 97 and t:piece(t.vocab_size - 1) == "<extra_id_0>" and t.pad == t.eos,
    "extra_ids = 3 and pad = \"</s>\" override the defaults")
  local ids = t:encode("<extra_id_2><extra_id_3>")
  T.ok(ids[1] == t.vocab_size - 3 and #ids > 3, "<extra_id_3> is text when there are 3 extra ids")
end

-- bad arguments and bad files: one line naming the file and this line
local function refuses(what, pattern, fn, ...)
  local ok, e = pcall(fn, ...)
  e = tostring(e)
  T.ok(not ok and e:find("^[^\n]*test_t5tok%.lua:%d+: ") ~= nil and e:find(pattern) ~= nil and not e:find("\n"),
    what .. ": " .. e)
end
local function write(path, s)
  local w = assert(io.open(path, "wb"))
  w:write(s)
  w:close()
end
refuses("invalid UTF-8", "encode: the text is not valid UTF%-8 %(byte 3%)", sp.encode, sp, "ab\xff")
refuses("max_length 0", "max_length must be an integer", sp.encode, sp, "a", {max_length = 0})
refuses("pad not a boolean", "pad must be true or false", sp.encode, sp, "a", {max_length = 4, pad = 1})
refuses("a missing file", "t5_tokenizer: cannot open 'no/such/spiece.model'", ck.t5_tokenizer, "no/such/spiece.model")
refuses("extra_ids out of range", "extra_ids must be an integer", ck.t5_tokenizer, D .. "spiece", {extra_ids = -1})

local mf = assert(io.open(D .. "spiece/spiece.model", "rb"))
local model = mf:read("a")
mf:close()
local bad = "t5tok_test_bad.model"
write(bad, model:sub(1, #model // 2))
refuses("a truncated spiece.model", "'t5tok_test_bad.model': ModelProto%.normalizer_spec %(field 3%) at byte %d+ declares %d+ bytes where %d+ remain",
  ck.t5_tokenizer, bad)
write(bad, "")
refuses("an empty file", "'t5tok_test_bad.model': the file is empty", ck.t5_tokenizer, bad)
write(bad, '{"model": {"type": "BPE", "vocab": {}}}')
refuses("a BPE tokenizer.json", "'t5tok_test_bad.model': model.type is \"BPE\"", ck.t5_tokenizer, bad)
write(bad, '{"model": {"type": "Unigram", "unk_id": 2, "vocab": [["<pad>", 0], ["</s>", 0], ["<unk>", 0], ["a", -1]]},' ..
  ' "added_tokens": [{"id": 1, "content": "</s>", "lstrip": true}]}')
refuses("an added token that strips", "added token '</s>' has lstrip set", ck.t5_tokenizer, bad)
write(bad, '{"model": {"type": "Unigram", "unk_id": 2, "vocab": [["<pad>", 0], ["</s>", 0], ["<unk>", 0], ["a", -1], ["a", -2]]}}')
refuses("a vocabulary entry twice", "entry 4 'a' is entry 3 again", ck.t5_tokenizer, bad)
write(bad, '{"model": {"type": "Unigram", "vocab": [["<pad>", 0], ["</s>", 0], ["<unk>", 0]]}, ' ..
  '"normalizer": {"type": "Precompiled", "precompiled_charsmap": "AAAAAAAA"}}')
refuses("a character map without a trie", "'t5tok_test_bad.model': the character map's trie has 0 units", ck.t5_tokenizer, bad)
write(bad, '{"model": {"type": "Unigram", "vocab": [["<pad>", 0], ["</s>", 0], ["<unk>", 0]]}, "model": 1}')
refuses("duplicate JSON keys", "'t5tok_test_bad.model' is not valid JSON", ck.t5_tokenizer, bad)
os.remove(bad)

T.done()

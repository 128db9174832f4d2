-- ck.clip_tokenizer against transformers' slow CLIPTokenizer (4.57.1), token
-- for token, without ftfy (caption_fix = "none") and with it (the default):
-- tests/ref/make_tokenizer_ref.py wrote the expected tokens, ids, 77-token
-- frames of both SDXL-style folders (pad <|endoftext|> and pad "!") and
-- kohya-ss' 150/225 chunks for each string of tests/data/tokenizer/cases.json,
-- and the cleaned text and ids with ftfy 6.3.1 of tests/data/tokenizer/
-- ftfy_cases.json (hard captions: quotes, fullwidth forms, entities,
-- ligatures, mojibake, CJK, emoji, format characters), all with a small CLIP
-- vocabulary (the first 3000 merges of the real bpe file). The folders
-- transformers 5 saves (tokenizer.json only) give the same ids as the
-- vocab.json + merges.txt ones. Bad files and bad arguments are one error
-- naming the file and this script's line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

local D = "tests/data/tokenizer/"
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
  for i = 1, math.min(#t, 90) do s[i] = tostring(t[i]) end
  return "{" .. table.concat(s, " ") .. (#t > 90 and " ..." or "") .. "}"
end

-- every case: f(case) -> got, want; the first mismatch is printed
local function all_cases(what, f)
  local bad, n = nil, 0
  for i, c in ipairs(ref.cases) do
    local got, want = f(c)
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

local l = ck.clip_tokenizer{dir = D .. "clip_l", caption_fix = "none"}
local g = ck.clip_tokenizer{dir = D .. "clip_g", caption_fix = "none"}
local b = ck.clip_tokenizer{bpe = D .. "bpe_small.txt.gz", caption_fix = "none"}
local b2 = ck.clip_tokenizer{bpe = D .. "bpe_small.txt.gz", pad = "!", caption_fix = "none"}

T.ok(l.bos == ref.bos and l.eos == ref.eos and l.vocab_size == ref.vocab_size and l.pad == ref.eos,
  string.format("clip_l: bos %d eos %d vocab %d, pad <|endoftext|> from special_tokens_map.json", l.bos, l.eos, l.vocab_size))
T.ok(g.pad == 0 and g.eos == ref.eos, "clip_g: pad \"!\" (id 0) from tokenizer_config.json's {content = ...} entry")
T.ok(b.bos == ref.bos and b.eos == ref.eos and b.vocab_size == ref.vocab_size and b.pad == b.eos,
  "the .txt.gz builds CLIP's vocabulary: the same size and special ids as vocab.json, pad <|endoftext|> by default")
T.ok(b2.pad == 0, "pad = \"!\" names the pad by its token")
T.ok(ck.clip_tokenizer{bpe = D .. "bpe_small.txt.gz", pad = 7}.pad == 7, "pad = 7 gives the pad by id")
do -- the built-in vocabulary is that file's
  local tiny = ck.clip_tokenizer{tiny = true, caption_fix = "none"}
  local same = tiny.vocab_size == b.vocab_size and tiny.bos == b.bos and tiny.pad == b.pad
  for _, text in ipairs{"a red circle on a blue square", "Émoji 🎉 and ünïcödé, 東京", "the thing's (inside) 123"} do
    local x, y = tiny:encode(text), b:encode(text)
    for i = 1, math.max(#x, #y) do same = same and x[i] == y[i] end
  end
  T.ok(same, "clip_tokenizer{tiny = true} is the tokenizer of bpe_small.txt.gz: the same vocabulary and ids")
  local ok, err = pcall(ck.clip_tokenizer, {tiny = 1})
  T.ok(not ok and tostring(err):find("tiny must be true", 1, true), "tiny = 1 is refused (" .. tostring(err) .. ")")
end
T.ok(l.caption_fix == "none" and ck.clip_tokenizer{dir = D .. "clip_l"}.caption_fix == "ftfy",
  "caption_fix: \"none\" as given, \"ftfy\" by default")

all_cases("tokenize (BPE strings)", function(c) if c.tokens_l then return l:tokenize(c.text), c.tokens_l end end)

local function wrap(ids, t)
  local w = {t.bos}
  for _, v in ipairs(ids) do w[#w + 1] = v end
  w[#w + 1] = t.eos
  return w
end
all_cases("encode, max_length = false (every token), clip_l", function(c)
  return l:encode(c.text, {max_length = false}), wrap(c.ids_l, l)
end)
all_cases("encode, max_length = false, clip_g (a lone \"!\" is the pad token, id 0)", function(c)
  return g:encode(c.text, {max_length = false}), wrap(c.ids_g, g)
end)
all_cases("encode to 77, truncated and padded with <|endoftext|> (clip_l)", function(c) return l:encode(c.text), c.l77 end)
all_cases("encode to 77, truncated and padded with \"!\" (clip_g)", function(c) return g:encode(c.text), c.g77 end)
all_cases("the .txt.gz gives the folder's ids (pad <|endoftext|>)", function(c) return b:encode(c.text), c.l77 end)
all_cases("the .txt.gz with pad = \"!\" gives clip_g's ids", function(c) return b2:encode(c.text), c.g77 end)

local function flat(chunks)
  local t = {}
  for _, ch in ipairs(chunks) do
    if #ch ~= 77 then return {} end
    for _, v in ipairs(ch) do t[#t + 1] = v end
  end
  return t
end
for _, k in ipairs{150, 225} do
  all_cases("encode_chunks " .. k .. " as kohya-ss makes them, pad <|endoftext|>", function(c)
    if c["l" .. k] then return flat(l:encode_chunks(c.text, k)), flat(c["l" .. k]) end
  end)
  all_cases("encode_chunks " .. k .. " as kohya-ss makes them, pad \"!\"", function(c)
    if c["g" .. k] then return flat(g:encode_chunks(c.text, k)), flat(c["g" .. k]) end
  end)
end

do
  local c = l:encode_chunks("a photo of a cat", 75)
  T.ok(#c == 1 and same(c[1], l:encode("a photo of a cat")), "encode_chunks 75: one chunk, the plain 77 frame")
  local short = l:encode("a photo of a cat", {max_length = 8, pad = false})
  T.ok(#short == 7 and short[1] == l.bos and short[7] == l.eos, "pad = false: no padding (" .. show(short) .. ")")
  local cut = l:encode(string.rep("cat ", 50), {max_length = 10})
  T.ok(#cut == 10 and cut[10] == l.eos and cut[9] ~= l.eos, "max_length = 10: 8 tokens, EOS last")
end

-- with ftfy (the default): the cleaned text and the ids of every case, both
-- folders; the hard captions tokenize as before with caption_fix = "none"
local fr
do
  local h = assert(io.open(D .. "ftfy_cases.json", "rb"))
  fr = ck.json_decode(h:read("a")).cases
  h:close()
end
local fl = ck.clip_tokenizer{dir = D .. "clip_l"}
local fg = ck.clip_tokenizer{dir = D .. "clip_g"}
local function each(what, cases, f)
  local bad, n = nil, 0
  for i, c in ipairs(cases) do
    local got, want = f(c)
    if want ~= nil then
      n = n + 1
      local ok = type(want) == "string" and got == want or type(want) == "table" and same(got, want)
      if not ok then
        bad = string.format("case %d %q: got %s, want %s", i, c.text,
          type(got) == "table" and show(got) or string.format("%q", got), type(want) == "table" and show(want) or
          string.format("%q", want))
        break
      end
    end
  end
  T.ok(bad == nil and n > 0, string.format("%s: %d strings match%s", what, n, bad and (" -- " .. bad) or ""))
end
local hard = {}
for _, c in ipairs(fr) do if c.hard then hard[#hard + 1] = c end end
each("ftfy: the cleaned text (fix_text, whitespace, lower case) as transformers makes it", fr,
  function(c) return fl:clean(c.text), c.clean end)
each("ftfy: clip_l's ids", fr, function(c) return fl:encode(c.text, {max_length = false}), wrap(c.ids_l, fl) end)
each("ftfy: clip_g's ids (a lone \"!\" its pad)", fr,
  function(c) return fg:encode(c.text, {max_length = false}), wrap(c.ids_g or c.ids_l, fg) end)
each("none: the hard captions' ids without ftfy, clip_l", hard,
  function(c) return l:encode(c.text, {max_length = false}), wrap(c.none_l, l) end)
each("none: the hard captions' ids without ftfy, clip_g", hard,
  function(c) return g:encode(c.text, {max_length = false}), wrap(c.none_g or c.none_l, g) end)
do
  local differ = 0
  for _, c in ipairs(hard) do
    if not same(c.ids_l, c.none_l) then differ = differ + 1 end
  end
  T.ok(differ >= 100, string.format("the hard captions test the difference: %d of %d tokenize differently with ftfy",
    differ, #hard))
end
local fb = ck.clip_tokenizer{bpe = D .. "bpe_small.txt.gz", pad = "!"}
each("ftfy: the .txt.gz with pad = \"!\" gives clip_g's ids, framed to 77", fr, function(c)
  local ids, f = c.ids_g or c.ids_l, {fb.bos}
  for i = 1, math.min(#ids, 75) do f[#f + 1] = ids[i] end
  f[#f + 1] = fb.eos
  while #f < 77 do f[#f + 1] = fb.pad end
  return fb:encode(c.text), f
end)

-- the folders transformers 5 saves: tokenizer.json and tokenizer_config.json
-- only; the same ids as the vocab.json + merges.txt folders, both ways
local l5 = ck.clip_tokenizer{dir = D .. "clip_l_tf5", caption_fix = "none"}
local g5 = ck.clip_tokenizer{dir = D .. "clip_g_tf5", caption_fix = "none"}
T.ok(l5.bos == l.bos and l5.eos == l.eos and l5.vocab_size == l.vocab_size and l5.pad == l.pad and g5.pad == 0,
  string.format("tokenizer.json folders: bos %d eos %d vocab %d, pads %d and %d from tokenizer_config.json",
    l5.bos, l5.eos, l5.vocab_size, l5.pad, g5.pad))
all_cases("tokenizer.json folder: clip_l's frames", function(c) return l5:encode(c.text), c.l77 end)
all_cases("tokenizer.json folder: clip_g's frames", function(c) return g5:encode(c.text), c.g77 end)
all_cases("tokenizer.json folder: clip_l's tokens", function(c) if c.tokens_l then return l5:tokenize(c.text), c.tokens_l end end)
local fg5 = ck.clip_tokenizer{dir = D .. "clip_g_tf5"}
each("tokenizer.json folder with ftfy: clip_g's ids", fr,
  function(c) return fg5:encode(c.text, {max_length = false}), wrap(c.ids_g or c.ids_l, fg5) end)
local j5 = ck.clip_tokenizer{json = D .. "clip_l_tf5/tokenizer.json", caption_fix = "none"}
all_cases("json = a tokenizer.json file: clip_l's frames", function(c) return j5:encode(c.text), c.l77 end)

-- errors: one line naming the file and this script's line
local tmp = string.format("out/test_tokenizer.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))
local function write(name, s)
  local h = assert(io.open(tmp .. "/" .. name, "wb"))
  h:write(s)
  h:close()
  return tmp .. "/" .. name
end
local function raises(what, pattern, fn, ...)
  local ok, err = pcall(fn, ...)
  T.ok(not ok and tostring(err):find("test_tokenizer%.lua:%d+:") and tostring(err):find(pattern),
    what .. " (" .. tostring(err) .. ")")
end
local src = assert(io.open(D .. "clip_l/merges.txt", "rb")):read("a")
raises("a folder without tokenizer files says what it lacks",
  "missing' holds no tokenizer: neither vocab%.json and merges%.txt nor tokenizer%.json",
  ck.clip_tokenizer, {dir = tmp .. "/missing"})
ck.mkdir(tmp .. "/badjson")
write("badjson/vocab.json", '{"a": 1,')
write("badjson/merges.txt", src)
raises("vocab.json that is not JSON names it", "badjson/vocab%.json': not JSON %(line 1: ",
  ck.clip_tokenizer, {dir = tmp .. "/badjson"})
write("badjson/vocab.json", '{"a": -1}')
raises("a negative id names the token", "badjson/vocab%.json': .*\"a\"", ck.clip_tokenizer, {dir = tmp .. "/badjson"})
write("badjson/vocab.json", '{"a": 0}')
raises("a vocabulary without <|startoftext|> names vocab.json", "badjson/vocab%.json': vocab%.json has no <|startoftext|>", ck.clip_tokenizer,
  {dir = tmp .. "/badjson"})
ck.mkdir(tmp .. "/badmerges")
write("badmerges/vocab.json", assert(io.open(D .. "clip_l/vocab.json", "rb")):read("a"))
write("badmerges/merges.txt", "#version: 0.2\na b\nc d e\n")
raises("a merges line of three tokens names the file and line", "badmerges/merges%.txt': merges line 3",
  ck.clip_tokenizer, {dir = tmp .. "/badmerges"})
ck.mkdir(tmp .. "/badtj")
write("badtj/tokenizer.json", '{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}')
raises("a tokenizer.json that is no BPE names the file and says so", "badtj/tokenizer%.json': tokenizer%.json: model%.type is \"Unigram\"",
  ck.clip_tokenizer, {dir = tmp .. "/badtj"})
write("badtj/tokenizer.json", '{"model": {"type": "BPE", "end_of_word_suffix": "</w>", "vocab": {"a": 0}, "merges": ["a"]}}')
raises("a tokenizer.json merge of one token names its index", "badtj/tokenizer%.json': .*model%.merges%[0%] is neither",
  ck.clip_tokenizer, {dir = tmp .. "/badtj"})
write("badtj/vocab.json", '{"a": 0}')
raises("vocab.json without merges.txt: the folder's tokenizer.json is what loads", "badtj/tokenizer%.json': .*model%.merges",
  ck.clip_tokenizer, {dir = tmp .. "/badtj"})
os.remove(tmp .. "/badtj/tokenizer.json")
raises("vocab.json without merges.txt and no tokenizer.json", "badtj/merges%.txt': No such file or directory %(and",
  ck.clip_tokenizer, {dir = tmp .. "/badtj"})
local gz = assert(io.open(D .. "bpe_small.txt.gz", "rb")):read("a")
raises("a truncated .gz names the file", "short%.gz': not a valid gzip file: it ends before",
  ck.clip_tokenizer, {bpe = write("short.gz", gz:sub(1, #gz // 2))})
raises("a file that is no gzip names the file", "plain%.gz': not a valid gzip file",
  ck.clip_tokenizer, {bpe = write("plain.gz", "#version 0.2\na b\n")})
raises("pad not in the vocabulary", "pad token 'nosuchtoken' is not in the vocabulary",
  ck.clip_tokenizer, {bpe = D .. "bpe_small.txt.gz", pad = "nosuchtoken"})
raises("pad id outside the vocabulary", "pad id 99999 is outside", ck.clip_tokenizer, {bpe = D .. "bpe_small.txt.gz", pad = 99999})
raises("a folder outside the sandbox is denied through its door", "reading '/etc/vocab%.json' is denied",
  ck.clip_tokenizer, {dir = "/etc"})
raises("a .txt.gz outside the sandbox is denied", "reading '/etc/passwd' is denied", ck.clip_tokenizer, {bpe = "/etc/passwd"})
raises("a directory given as bpe is no regular file", "': not a regular file", ck.clip_tokenizer, {bpe = D})
raises("both dir and bpe", "one of dir", ck.clip_tokenizer, {dir = D .. "clip_l", bpe = D .. "bpe_small.txt.gz"})
raises("invalid UTF-8 names the byte", "not valid UTF%-8 %(byte 3%)", l.encode, l, "ab\xff")
raises("max_token_length not a multiple of 75", "multiple of 75", l.encode_chunks, l, "x", 100)
raises("max_length below 2", "max_length must be", l.encode, l, "x", {max_length = 1})

-- encode.models: --tokenizer in place of the base's folders, --caption-fix to both
do
  local encode = require "ck.encode"
  ck.mkdir(tmp .. "/given")
  write("given/vocab.json", '{"!": 0, "a": 1, "a</w>": 2, "<|startoftext|>": 3, "<|endoftext|>": 4}')
  write("given/merges.txt", "#version: 0.2\n")
  local base = {file = "base.safetensors", tokenizer = D .. "clip_l", tokenizer_2 = D .. "clip_g"}
  local m = encode.models{base = base}
  T.ok(m.tokenizer_l.vocab_size == ref.vocab_size and m.tokenizer_g.pad == 0 and m.tokenizer_l.caption_fix == "ftfy"
    and m.id:find("caption_fix ftfy", 1, true),
    "encode.models: the base's tokenizer folders, ftfy by default (and in the cache id)")
  m = encode.models{base = base, tokenizer = tmp .. "/given", caption_fix = "none"}
  T.ok(m.tokenizer_l.vocab_size == 5 and m.tokenizer_g.vocab_size == 5 and m.tokenizer_g.pad == 0 and
    m.tokenizer_l.caption_fix == "none" and m.tokenizer_g.caption_fix == "none" and m.id:find("tokenizer ", 1, true)
    and not m.id:find("caption_fix", 1, true),
    "encode.models: --tokenizer DIR replaces the base's folders (tokenizer_2 padding with \"!\"), --caption-fix none")
  m = encode.models{base = base, tokenizer = D .. "clip_l_tf5/tokenizer.json"}
  T.ok(m.tokenizer_l.vocab_size == ref.vocab_size and m.tokenizer_g.pad == 0,
    "encode.models: --tokenizer a tokenizer.json")
  m = encode.models{base = {file = "b", tokenizer = D .. "clip_l_tf5", tokenizer_2 = D .. "clip_g_tf5"}}
  T.ok(m.tokenizer_l.pad == ref.eos and m.tokenizer_g.pad == 0, "encode.models: a base whose folders hold only tokenizer.json")
  local ok, err = pcall(encode.models, {base = base, caption_fix = "nfkc"})
  T.ok(not ok and tostring(err):find("caption%-fix must be ftfy or none"), "encode.models: a bad caption fix (" ..
    tostring(err) .. ")")
  raises("a caption fix ck.clip_tokenizer does not know", "caption_fix must be \"ftfy\" or \"none\"",
    ck.clip_tokenizer, {dir = D .. "clip_l", caption_fix = "nfkc"})
end

-- options are read raw: a metatable on the options table is not consulted
local opts = setmetatable({}, {__index = function() error("options read through __index") end})
T.ok(pcall(l.encode, l, "x", opts), "encode's options are read raw")

-- the scratch folder goes
for _, d in ipairs{"badjson", "badmerges", "given", "badtj"} do
  for _, n in ipairs(ck.listdir(tmp .. "/" .. d) or {}) do os.remove(tmp .. "/" .. d .. "/" .. n) end
  os.remove(tmp .. "/" .. d)
end
for _, n in ipairs(ck.listdir(tmp) or {}) do os.remove(tmp .. "/" .. n) end
os.remove(tmp)

T.done()

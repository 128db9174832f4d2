-- ck.toml_decode and ck.read_toml (toml++ behind vm/formats/toml_shim.h):
-- kohya's config files decode to the tables they spell, with integers as
-- integers, floats as floats and dates as text; where = true gives each
-- table's keys in the file's order with their lines; a bad text or file is
-- one error naming the script line, the file, and the line and column.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

-- a and b hold the same values (tables compared entry by entry, numbers by value and type)
local function same(a, b, path)
  path = path or "value"
  if type(a) ~= type(b) then return false, path .. ": " .. type(a) .. " vs " .. type(b) end
  if type(a) == "number" and math.type(a) ~= math.type(b) then return false, path .. ": " .. math.type(a) .. " vs " .. math.type(b) end
  if type(a) ~= "table" then
    if a == b or (a ~= a and b ~= b) then return true end
    return false, path .. ": " .. tostring(a) .. " vs " .. tostring(b)
  end
  for k, v in pairs(a) do
    local ok, why = same(v, b[k], path .. "." .. tostring(k))
    if not ok then return false, why end
  end
  for k in pairs(b) do
    if a[k] == nil then return false, path .. "." .. tostring(k) .. ": missing" end
  end
  return true
end

-- the samples of kohya's docs/config_README-en.md (sd-scripts)
local DATASET = [==[
[general]
shuffle_caption = true
caption_extension = '.txt'
keep_tokens = 1

# This is a DreamBooth-style dataset
[[datasets]]
resolution = 512
batch_size = 4
keep_tokens = 2

  [[datasets.subsets]]
  image_dir = 'C:\hoge'
  class_tokens = 'hoge girl'
  # This subset uses keep_tokens = 2 (the value of the parent datasets)

  [[datasets.subsets]]
  image_dir = 'C:\fuga'
  class_tokens = 'fuga boy'
  keep_tokens = 3

  [[datasets.subsets]]
  is_reg = true
  image_dir = 'C:\reg'
  class_tokens = 'human'
  keep_tokens = 1

# This is a fine-tuning dataset
[[datasets]]
resolution = [768, 768]
batch_size = 2

  [[datasets.subsets]]
  image_dir = 'C:\piyo'
  metadata_file = 'C:\piyo\piyo_md.json'
  # This subset uses keep_tokens = 1 (the value of [general])
]==]

do
  local v = ck.toml_decode(DATASET, "dataset.toml")
  local ok, why = same(v, {
    general = {shuffle_caption = true, caption_extension = ".txt", keep_tokens = 1},
    datasets = {
      {resolution = 512, batch_size = 4, keep_tokens = 2, subsets = {
        {image_dir = "C:\\hoge", class_tokens = "hoge girl"},
        {image_dir = "C:\\fuga", class_tokens = "fuga boy", keep_tokens = 3},
        {is_reg = true, image_dir = "C:\\reg", class_tokens = "human", keep_tokens = 1},
      }},
      {resolution = {768, 768}, batch_size = 2, subsets = {
        {image_dir = "C:\\piyo", metadata_file = "C:\\piyo\\piyo_md.json"},
      }},
    },
  })
  T.ok(ok, "kohya's dataset config sample decodes to the tables it spells (" .. tostring(why) .. ")")
end

do
  local v = ck.toml_decode([==[
[general]
flip_aug = true
color_aug = false
resolution = [1024, 1024]

[[datasets]]
batch_size = 6
enable_bucket = true
bucket_no_upscale = true
caption_extension = ".txt"
keep_tokens_separator= "|||"
shuffle_caption = true
caption_tag_dropout_rate = 0.1
secondary_separator = ";;;" # subset 側に書くこともできます / can be written in the subset side
enable_wildcard = true # 同上 / same as above

  [[datasets.subsets]]
  image_dir = "/path/to/image_dir"
  num_repeats = 1

  # ||| の前後はカンマは不要です（自動的に追加されます） / No comma is required before and after ||| (it is added automatically)
  caption_prefix = "1girl, hatsune miku, vocaloid |||"
  caption_suffix = ", anime screencap ||| masterpiece, rating: general"
]==])
  local d = v.datasets[1]
  T.ok(v.general.flip_aug == true and v.general.resolution[2] == 1024 and d.batch_size == 6 and
    d.keep_tokens_separator == "|||" and d.secondary_separator == ";;;" and d.subsets[1].num_repeats == 1 and
    d.subsets[1].caption_suffix == ", anime screencap ||| masterpiece, rating: general",
    "kohya's second sample (comments in Japanese, a key without a space before =) decodes")
  T.ok(math.type(d.caption_tag_dropout_rate) == "float" and d.caption_tag_dropout_rate == 0.1 and
    math.type(d.batch_size) == "integer", "0.1 is a float and 6 an integer")
end

do
  local v = ck.toml_decode('a = 1979-05-27T07:32:00Z\nb = 1979-05-27 07:32:00.5\nc = 1979-05-27\nd = 07:32:00\n' ..
    'e = inf\nf = -nan\ng = 0x10\nh = 1e2\ni = "caf\\u00e9"\nj = """\nx\\\n  y"""\n')
  T.ok(v.a == "1979-05-27T07:32:00Z" and v.b == "1979-05-27T07:32:00.5" and v.c == "1979-05-27" and v.d == "07:32:00",
    "dates and times are RFC 3339 text")
  T.ok(v.e == math.huge and v.f ~= v.f and v.g == 16 and math.type(v.g) == "integer" and v.h == 100.0 and
    math.type(v.h) == "float", "inf, nan, hex integers, exponent floats")
  T.ok(v.i == "café" and v.j == "xy", "escapes, and a multi-line string's first newline and line-ending backslash")
end

do
  local text = "# a run\nzeta = 1\n[alpha]\nb = 2\na = 3\n[[list]]\nx = 1\n[[list]]\nx = 2\n"
  local v, where = ck.toml_decode(text, "run.toml", {where = true})
  T.ok(table.concat(where[v].order, ",") == "zeta,alpha,list" and where[v].line.zeta == 2 and where[v].line.alpha == 3,
    "where: the root's keys in the file's order, with their lines")
  T.ok(table.concat(where[v.alpha].order, ",") == "b,a" and where[v.alpha].line.a == 5 and where[v.alpha].col.a == 1,
    "a table's keys in the file's order (toml++ keeps them sorted), line and column")
  T.ok(where[v.list].line[2] == 8 and where[v.list[2]].line.x == 9 and where[v.list[2]].order[1] == "x",
    "an array of tables: each table's header line, and its own keys")
  T.ok(select("#", ck.toml_decode(text)) == 1, "without where, one value")
end

-- errors name the script line, the text and the line and column
local function raises(what, pattern, fn, ...)
  local ok, err = pcall(fn, ...)
  T.ok(not ok and tostring(err):match(pattern) and not tostring(err):find("\n"),
    what .. " (" .. tostring(err) .. ")")
end

raises("a syntax error names the script line, the text's name, line and column",
  "test_toml%.lua:%d+: toml_decode: 'x%.toml': line 2, column 5: ", ck.toml_decode, "a = 1\nb = = 2\n", "x.toml")
raises("without a name, the line and column alone", "toml_decode: line 1, column 1: tables and arrays nest 40 levels",
  ck.toml_decode, ("a."):rep(39) .. "b = 1")
raises("a key given twice", "line 3, column 5: .*cannot redefine", ck.toml_decode, "[t]\nk = 1\nk = 2\n", "dup.toml")
raises("an unknown option", "toml_decode: unknown option 'ordered' %(it takes where = true%)", ck.toml_decode, "", nil,
  {ordered = true})

local tmp = string.format("out/test_toml.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))
local function write(name, s)
  local f = assert(io.open(tmp .. "/" .. name, "wb"))
  f:write(s)
  f:close()
  return tmp .. "/" .. name
end

do
  local path = write("dataset.toml", DATASET)
  local v, where = ck.read_toml(path, {where = true})
  T.ok(v.datasets[1].subsets[3].is_reg == true and where[v.datasets[1].subsets].line[3] == 22,
    "read_toml reads a file through the sandbox's door, with where")
  raises("a missing file", "read_toml: cannot open '" .. tmp:gsub("%p", "%%%0") .. "/none%.toml': No such file",
    ck.read_toml, tmp .. "/none.toml")
  raises("a file past 1 MiB is refused by its size before it is read",
    "read_toml: '.-big%.toml': 1048577 bytes: more than the 1024 KiB a TOML file may hold",
    ck.read_toml, write("big.toml", "a = '" .. ("x"):rep((1 << 20) - 6) .. "'\n"))
  raises("a NUL byte names the file and its place", "read_toml: '.-nul%.toml': line 2, column 6: a NUL byte",
    ck.read_toml, write("nul.toml", "a = 1\nb = '\0'\n"))
  raises("invalid UTF-8", "read_toml: '.-utf8%.toml': line 1, column 6: not valid UTF%-8", ck.read_toml,
    write("utf8.toml", "a = '\xff'\n"))
  raises("a file cut short", "read_toml: '.-cut%.toml': line 2, column %d+: ", ck.read_toml,
    write("cut.toml", "[[datasets]]\nresolution = [512,"))
  raises("a folder is no file", "read_toml: '.-': not a regular file", ck.read_toml, tmp)
  raises("reading outside the allowed folders is denied", "reading '/etc/hostname' is denied", ck.read_toml, "/etc/hostname")
end

T.done()

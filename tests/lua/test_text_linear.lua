-- Caption and prompt handling is linear in its input: 200 KB captions, caption
-- files, prompt-file lines and option lists of the shapes that make
-- backtracking patterns quadratic (a run of spaces between two words, spaces
-- before a separator, a run ending in a tab) are each handled in well under a
-- second, where a quadratic pass over them takes minutes. The results are
-- checked too, so that a fast wrong answer fails.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local imagedata = require "ck.imagedata"
local pipeline = require "ck.pipeline"
local options = require "ck.options"

-- generous: the linear passes take milliseconds; the quadratic ones took
-- over a minute on 100 KB
local BOUND = 2.0
local N = 200000
local SP = string.rep(" ", N)

local function timed(what, fn)
  local t0 = ck.now()
  local ok, r = pcall(fn)
  local dt = ck.now() - t0
  T.ok(ok and dt < BOUND, string.format("%s in %.3f s (bound %.1f s)%s", what, dt, BOUND, ok and "" or ": " .. tostring(r)))
  return ok and r
end

local shapes = {
  {"a run of spaces between two words", "a" .. SP .. "b"},
  {"spaces alone", SP},
  {"a word, then spaces and a tab", "a" .. SP .. "\t"},
  {"spaces around a separator, many times", string.rep("x  ,  ", N // 6)},
}

-- strip; the reference walks the bytes
local function is_space(b) return b == 32 or (b >= 9 and b <= 13) end
local function ref_strip(s)
  local a, b = 1, #s
  while a <= b and is_space(s:byte(a)) do a = a + 1 end
  while b >= a and is_space(s:byte(b)) do b = b - 1 end
  return s:sub(a, b)
end
for _, s in ipairs(shapes) do
  local r = timed("imagedata.strip of " .. s[1], function() return imagedata.strip(s[2]) end)
  local want = ref_strip(s[2])
  T.ok(r == want, "imagedata.strip of " .. s[1] .. " keeps what lies between the first and last non-space")
end

-- captions: every option that splits, trims, shuffles or keeps
local copts = {
  {"shuffle_caption", {shuffle = true}},
  {"keep_tokens", {shuffle = true, keep_tokens = 3}},
  {"keep_tokens_separator", {shuffle = true, keep_tokens_separator = "|||"}},
  {"tag dropout", {tag_dropout_rate = 0.5}},
  {"secondary_separator", {shuffle = true, secondary_separator = ";;;"}},
  {"a long separator", {shuffle = true, separator = ",,,,"}},
  {"prefix and suffix", {prefix = SP, suffix = SP}},
}
for _, s in ipairs(shapes) do
  for _, c in ipairs(copts) do
    local r = timed("imagedata.caption of " .. s[1] .. " with " .. c[1], function() return imagedata.caption(s[2], c[2]) end)
    T.ok(type(r) == "string", "  gives a caption")
  end
end
local tags = {}
for i = 1, 20000 do tags[i] = "tag" .. i end
local r = timed("imagedata.caption shuffling 20000 tags with spaces", function()
  return imagedata.caption(table.concat(tags, " ,   "), {shuffle = true, keep_tokens = 2, seed = 1})
end)
T.ok(r and select(2, r:gsub(", ", "")) == 19999 and r:sub(1, 10) == "tag1, tag2", "  every tag kept, the first two in place")

-- caption files, read by the folder scan
local tmp = string.format("out/test_text_linear.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))
local function write(p, s)
  local f = assert(io.open(p, "wb"))
  f:write(s)
  f:close()
end
write(tmp .. "/a.png", "")
write(tmp .. "/a.txt", "  cat" .. SP .. "dog" .. SP .. "\r\nsecond line")
local set = timed("imagedata.scan of a 400 KB caption file", function()
  return imagedata.scan(tmp, {info = function() return {width = 64, height = 64} end})
end)
T.ok(set and set.items[1].caption == "cat" .. SP .. "dog", "  the caption is its first line, trimmed")

-- prompt files: the prompt, the negative prompt and option values
write(tmp .. "/p.txt", table.concat({
  "  a" .. SP .. "cat" .. SP .. " --n  blurry" .. SP .. "x" .. SP .. " --w 64" .. SP .. " --s  3" .. SP,
  SP,
  "# " .. SP .. "x",
  "b" .. SP .. "\t\r",
}, "\n"))
local ps = timed("pipeline.read_prompts of 1.4 MB of lines of spaces", function()
  return pipeline.read_prompts(tmp .. "/p.txt", {width = 64, height = 64, steps = 2, cfg = 5, seed = 0, sampler = "euler"})
end)
T.ok(ps and #ps == 2 and ps[1].prompt == "a" .. SP .. "cat" and ps[1].negative_prompt == "blurry" .. SP .. "x" and
  ps[1].width == 64 and ps[1].steps == 3 and ps[2].prompt == "b" and ps[2].line == 4,
  "  two prompts, each part trimmed")
write(tmp .. "/bad.txt", "a --w" .. SP .. "x" .. SP .. "\n")
local t0 = ck.now()
local ok, err = pcall(pipeline.read_prompts, tmp .. "/bad.txt", {width = 64, height = 64, steps = 2, cfg = 5, seed = 0,
                                                                sampler = "euler"})
T.ok(not ok and ck.now() - t0 < BOUND and #tostring(err) < 300 and tostring(err):find("bad.txt:1: --w must be a whole number", 1, true),
  "a bad value of 400 KB is refused at once, in a short line: " .. tostring(err))

-- option lists (--resolution, --lora)
local l = timed("options' list of 200 KB of spaces between two items", function()
  return options.types.list(nil, "a" .. SP .. "b ," .. SP .. "c" .. SP)
end)
T.ok(l and #l == 2 and l[1] == "a" .. SP .. "b" and l[2] == "c", "  two items, trimmed")

T.done()

-- ck.image_info, ck.image_load and ck.write_png against the files
-- tests/ref/make_image_ref.py made with Pillow (tests/data/image): each
-- format and mode decodes to Pillow's pixels (PNG and lossless WebP exactly,
-- JPEG and lossy WebP within the manifest's tolerance); resizing against the
-- area-average and linear formulas computed here; crop and flip exactly; a
-- PNG written and read back bit-exact with its text chunks; truncated,
-- corrupt, empty, zero-size and oversized files refused with the file named;
-- a failed write leaves the old file; denied paths refused (the sandbox).
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

local DATA = "tests/data/image/"

local function read_all(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function write_all(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- f must raise one line naming this script's line and holding want (a
-- string, or a list of strings each found in it)
local function fails(f, want, what)
  local ok, err = pcall(f)
  err = tostring(err)
  local found = true
  for _, w in ipairs(type(want) == "table" and want or {want}) do found = found and err:find(w, 1, true) ~= nil end
  T.ok(not ok and err:match("^[^\n]-test_image%.lua:%d+: ") ~= nil and found and not err:find("\n"),
    what .. " (" .. err .. ")")
end

-- 8-bit sample (0..255) of an image array at channel c, row y, column x (0-based)
local function sample(a, c, y, x)
  local s = a.shape
  return (a:get(1 + (c * s[2] + y) * s[3] + x) + 1) * 127.5
end

-- the manifest: every file decodes to its reference within its tolerance
local entries = {}
for line in io.lines(DATA .. "manifest.txt") do
  local name, w, h, fmt, tol = line:match("^(%S+) (%d+) (%d+) (%a+) (%-?%d+)")
  if name then entries[#entries + 1] = {name = name, w = tonumber(w), h = tonumber(h), fmt = fmt, tol = tonumber(tol)} end
end
T.ok(#entries >= 20, #entries .. " reference images in the manifest")
local decoded = {}
for _, e in ipairs(entries) do
  local path = DATA .. e.name
  local info = ck.image_info(path)
  T.ok(info.width == e.w and info.height == e.h and info.format == e.fmt,
    e.name .. ": image_info gives " .. info.width .. "x" .. info.height .. " " .. info.format)
  if e.tol < 0 then
    fails(function() ck.image_load(path) end, path .. ": a CMYK JPEG, which is not supported", e.name .. " is refused")
  else
    local a = ck.image_load(path)
    local s = a.shape
    local ref = read_all(path .. ".rgb")
    local worst, grid = 0, true
    for y = 0, e.h - 1 do
      for x = 0, e.w - 1 do
        for c = 0, 2 do
          local v = sample(a, c, y, x)
          local b = ref:byte(1 + (y * e.w + x) * 3 + c)
          worst = math.max(worst, math.abs(v - b))
          -- the value is v / 127.5 - 1 of a whole byte
          grid = grid and math.abs(v - math.floor(v + 0.5)) < 1e-3
        end
      end
    end
    decoded[e.name] = a
    T.ok(s[1] == 3 and s[2] == e.h and s[3] == e.w and #ref == e.w * e.h * 3 and grid and worst <= e.tol + 1e-3,
      string.format("%s: [3, %d, %d] matches Pillow's decode within %d (largest difference %g)", e.name, e.h, e.w,
        e.tol, worst))
  end
end

-- the text chunks Pillow wrote (tEXt, iTXt, zTXt)
do
  local t = ck.image_info(DATA .. "text.png").text
  T.ok(t.parameters == "a photo of a cat, Steps: 20" and t.Comment == "caf\u{e9} \u{2603}" and t.Software == "Pillow",
    "image_info reads the text chunks: tEXt, iTXt (UTF-8) and zTXt")
  T.ok(ck.image_info(DATA .. "rgb420.jpg").text == nil, "a JPEG has no text table")
end

-- resizing against the formulas, on the exactly decoded 17x11 PNG
local src = decoded["rgb8.png"]
local SW, SH = 17, 11

-- taps of one axis: {{index, weight}, ...} for output k of length d from s
local function taps(s, d, k)
  if d == s then return {{k, 1}} end
  if d > s then -- linear between pixel centres, clamped at the edges
    local x = math.max((k + 0.5) * s / d - 0.5, 0)
    local i = math.floor(x)
    if i >= s - 1 then return {{s - 1, 1}} end
    return {{i, 1 - (x - i)}, {i + 1, x - i}}
  end
  -- area: the mean over [k*s/d, (k+1)*s/d)
  local scale = s / d
  local a, b, out = k * scale, (k + 1) * scale, {}
  for i = math.floor(a), math.ceil(b) - 1 do
    local overlap = math.min(i + 1, b) - math.max(i, a)
    if overlap > 1e-12 and i < s then out[#out + 1] = {i, overlap / scale} end
  end
  return out
end

local function resized_by_hand(a, w, h, c, y, x)
  local sum = 0
  for _, ty in ipairs(taps(a.shape[2], h, y)) do
    for _, tx in ipairs(taps(a.shape[3], w, x)) do sum = sum + ty[2] * tx[2] * sample(a, c, ty[1], tx[1]) end
  end
  return sum
end

local function compare(got, want_fn, w, h, what)
  local worst = 0
  for c = 0, 2 do
    for y = 0, h - 1 do
      for x = 0, w - 1 do
        local want = want_fn(c, y, x) / 127.5 - 1
        local v = got:get(1 + (c * h + y) * w + x)
        worst = math.max(worst, math.abs(v - want) / math.max(1, math.abs(want)))
      end
    end
  end
  T.ok(got.shape[1] == 3 and got.shape[2] == h and got.shape[3] == w and worst <= 1e-4,
    string.format("%s: [3, %d, %d] (largest relative difference %.2g)", what, h, w, worst))
end

for _, size in ipairs{{7, 5, "area both ways, non-integer ratios"}, {29, 19, "linear both ways"},
                      {23, 6, "linear across, area down"}, {17, 4, "width kept, area down"}} do
  local w, h = size[1], size[2]
  local got = ck.image_load(DATA .. "rgb8.png", {resize = {w, h}})
  compare(got, function(c, y, x) return resized_by_hand(src, w, h, c, y, x) end, w, h, "resize to " .. w .. "x" .. h ..
    " (" .. size[3] .. ")")
end

-- an image made here: area averaging by whole factors is the mean of each block
do
  local W, H = 18, 12
  local a = ck.array({3, H, W})
  local r = T.rng(11)
  for i = 1, #a do a:set(i, (math.floor(r(0, 256)) % 256) / 127.5 - 1) end
  ck.write_png("image_test_blocks.png", a)
  local got = ck.image_load("image_test_blocks.png", {resize = {6, 4}})
  compare(got, function(c, y, x)
    local sum = 0
    for dy = 0, 2 do for dx = 0, 2 do sum = sum + sample(a, c, 3 * y + dy, 3 * x + dx) end end
    return sum / 9
  end, 6, 4, "resize 18x12 to 6x4 is the mean of each 3x3 block")
  local m = ck.image_load("image_test_blocks.png", {resize = {5, 7}})
  local mean_in, mean_out = 0, 0
  for i = 1, #a do mean_in = mean_in + a:get(i) end
  for i = 1, #m do mean_out = mean_out + m:get(i) end
  T.ok(math.abs(mean_in / #a - mean_out / #m) < 1e-5, "area averaging by any ratio keeps the image's mean")
  os.remove("image_test_blocks.png")
end

-- crop and flip, exactly
do
  local c = ck.image_load(DATA .. "rgb8.png", {crop = {2, 3, 5, 7}})
  compare(c, function(ch, y, x) return sample(src, ch, y + 2, x + 3) end, 7, 5, "crop {top 2, left 3, 5 high, 7 wide}")
  local f = ck.image_load(DATA .. "rgb8.png", {flip = true})
  compare(f, function(ch, y, x) return sample(src, ch, y, SW - 1 - x) end, SW, SH, "flip mirrors left to right")
  local cf = ck.image_load(DATA .. "rgb8.png", {crop = {2, 3, 5, 7}, flip = true})
  compare(cf, function(ch, y, x) return sample(src, ch, y + 2, 3 + 6 - x) end, 7, 5, "the flip comes after the crop")
  local all = ck.image_load(DATA .. "rgb8.png", {resize = {29, 19}, crop = {4, 6, 10, 12}, flip = true})
  compare(all, function(ch, y, x) return resized_by_hand(src, 29, 19, ch, y + 4, 6 + 11 - x) end, 12, 10,
    "resize, then crop in the resized image, then flip")
  fails(function() ck.image_load(DATA .. "rgb8.png", {crop = {8, 0, 4, 17}}) end, "does not fit in an image of 17x11",
    "a crop past the edge is refused")
  fails(function() ck.image_load(DATA .. "rgb8.png", {resize = {0, 5}}) end, "resize {0, 5} is not a size",
    "a resize to nothing is refused")
  fails(function() ck.image_load(DATA .. "rgb8.png", {crop = {1, 2}}) end, "crop must be a list of 4 integers",
    "a crop of two numbers is refused")
  fails(function() ck.image_load(DATA .. "rgb8.png", {flip = 1}) end, "flip must be a boolean", "flip = 1 is refused")
end

-- writing: round trip, text chunks, rounding and clamping
do
  local a = decoded["rgb8_interlaced.png"]
  ck.write_png("image_test_out.png", a, {text = {parameters = "a cat, Steps: 20, Seed: 7", Comment = "caf\u{e9}", n = 12}})
  local back = ck.image_load("image_test_out.png")
  local same = #back == #a
  for i = 1, #a do same = same and back:get(i) == a:get(i) end
  T.ok(same and back.shape[2] == a.shape[2] and back.shape[3] == a.shape[3], "write_png then image_load is bit-exact")
  local info = ck.image_info("image_test_out.png")
  T.ok(info.format == "png" and info.text.parameters == "a cat, Steps: 20, Seed: 7" and info.text.Comment ==
    "caf\u{e9}" and info.text.n == "12", "the text chunks read back (an ASCII one, a UTF-8 one, a number as text)")
  local bytes = read_all("image_test_out.png")
  T.ok(bytes:find("tEXtparameters\0a cat, Steps: 20, Seed: 7", 1, true) ~= nil and
    bytes:find("iTXtComment\0", 1, true) ~= nil, "an ASCII value is a tEXt chunk, a UTF-8 one an iTXt chunk")
  local q = ck.array({3, 1, 4}, {100.4 / 127.5 - 1, 100.6 / 127.5 - 1, 2, -3, 0, 0, 0, 0, 0, 0, 0, 0})
  ck.write_png("image_test_out.png", q)
  local r = ck.image_load("image_test_out.png")
  local function near(v, b) return math.abs(v - b) < 1e-3 end
  T.ok(near(sample(r, 0, 0, 0), 100) and near(sample(r, 0, 0, 1), 101) and near(sample(r, 0, 0, 2), 255) and
    near(sample(r, 0, 0, 3), 0) and near(sample(r, 1, 0, 0), 128),
    "(x + 1) * 127.5 is rounded to the nearest byte, and clamped to 0..255")

  -- a failed write leaves the existing file as it was, and no temp file
  ck.write_png("image_test_out.png", a)
  local before = read_all("image_test_out.png")
  local nan = ck.array({3, 2, 2}, 0)
  nan:set(6, 0 / 0)
  fails(function() ck.write_png("image_test_out.png", nan) end, "image_test_out.png: the array holds NaN at index 6",
    "NaN is refused, naming the file")
  fails(function() ck.write_png("image_test_out.png", a, {text = {[" bad key"] = "x"}}) end,
    "text key ' bad key' is not 1 to 79 printable ASCII", "a text key PNG cannot hold is refused")
  fails(function() ck.write_png("image_test_out.png", a, {text = {k = "a\0b"}}) end, "text 'k' holds a NUL byte",
    "a text value with a NUL byte is refused")
  fails(function() ck.write_png("image_test_out.png", ck.array({4, 2, 2})) end, "the array is [4, 2, 2], not [3, H, W]",
    "an array that is not [3, H, W] is refused")
  fails(function() ck.write_png("image_test_out.png", ck.array({3, 1, 1, 1, 1, 1, 1})) end,
    "an array of 7 dims where at most 6 fit", "an array of more dims than a tensor holds is refused")
  fails(function() ck.write_png("image_test_out.png", {1, 2, 3}) end, "ck.array expected", "a table is not an array")
  fails(function() ck.write_png("no_such_dir/x.png", a) end, "no_such_dir/x.png: cannot open its directory",
    "a missing directory is refused, naming the file")
  T.ok(read_all("image_test_out.png") == before, "after the failed writes the file is byte-identical")
  local leftover = false
  for _, n in ipairs(ck.listdir(".")) do leftover = leftover or n:find("image_test_out.png.tmp", 1, true) ~= nil end
  T.ok(not leftover, "no temp file is left behind")
  os.remove("image_test_out.png")
end

-- option tables are read raw: their metamethods never run
do
  local trap = {__index = function() error("ran __index") end, __len = function() error("ran __len") end,
                __pairs = function() error("ran __pairs") end}
  local a = ck.image_load(DATA .. "rgb8.png", setmetatable({resize = setmetatable({5, 4}, trap)}, trap))
  T.ok(a.shape[2] == 4 and a.shape[3] == 5, "image_load reads its options raw (no __index, __len)")
  ck.write_png("image_test_raw.png", a, setmetatable({text = setmetatable({k = "v"}, trap)}, trap))
  T.ok(ck.image_info("image_test_raw.png").text.k == "v", "write_png reads its options and text raw (no __pairs)")
  os.remove("image_test_raw.png")
end

-- an image into a program input, without a Lua table
do
  local g = ck.graph()
  local x = g:input("pixels", {2, 3, 11, 17})
  local p = g:compile{outputs = {x * x}}
  p:set("pixels", decoded["rgb8.png"], 2)
  local back = p:array("pixels"):slice(1, 2, 1)
  local same = #back == #decoded["rgb8.png"]
  for i = 1, #back do same = same and back:get(i) == decoded["rgb8.png"]:get(i) end
  T.ok(same, "a loaded image sets one batch entry of a program input and reads back the same")
end

-- the sandbox: reads and writes outside the allowed directories are denied
fails(function() ck.write_png("../image_test_escape.png", decoded["rgb8.png"]) end,
  "writing '../image_test_escape.png' is denied", "write_png outside the working directory is denied")
fails(function() ck.image_load("/etc/passwd") end, "reading '/etc/passwd' is denied", "image_load of /etc/passwd is denied")
fails(function() ck.image_info("/etc/passwd") end, "reading '/etc/passwd' is denied", "image_info of /etc/passwd is denied")

-- bad files: each refused with one line naming the file
do
  local W = "image_test_bad"
  assert(ck.mkdir(W))
  local cases = {}
  for _, n in ipairs{"rgb8.png", "rgb8_interlaced.png", "rgb420.jpg", "progressive.jpg", "lossless.webp", "lossy.webp",
                     "lossy_alpha.webp"} do
    local s = read_all(DATA .. n)
    for _, frac in ipairs{0.5, 0.9} do
      cases[#cases + 1] = {n .. " cut to " .. math.floor(frac * 100) .. "%", s:sub(1, math.floor(#s * frac)), n:match("%.(%a+)$"),
        "truncated"}
    end
    cases[#cases + 1] = {n .. " without its last 2 bytes", s:sub(1, #s - 2), n:match("%.(%a+)$"), "truncated"}
  end
  local png = read_all(DATA .. "rgb8.png")
  local at = png:find("IDAT", 1, true) + 10
  cases[#cases + 1] = {"rgb8.png with its image data changed (CRC mismatch)",
    png:sub(1, at - 1) .. string.char(png:byte(at) ~ 0x55) .. png:sub(at + 1), "png"}
  cases[#cases + 1] = {"an empty file", "", "png"}
  cases[#cases + 1] = {"a text file", "hello, this is not an image\n", "png"}

  -- PNGs made byte by byte: a zero-width one, and one of 65536 x 65536
  local crc_table = {}
  for i = 0, 255 do
    local c = i
    for _ = 1, 8 do c = (c & 1) ~= 0 and (0xEDB88320 ~ (c >> 1)) or (c >> 1) end
    crc_table[i] = c
  end
  local function crc32(s)
    local c = 0xFFFFFFFF
    for i = 1, #s do c = crc_table[(c ~ s:byte(i)) & 0xFF] ~ (c >> 8) end
    return c ~ 0xFFFFFFFF
  end
  local function chunk(kind, data) return string.pack(">I4", #data) .. kind .. data .. string.pack(">I4", crc32(kind .. data)) end
  local function png_of(w, h)
    return "\x89PNG\r\n\x1a\n" .. chunk("IHDR", string.pack(">I4I4BBBBB", w, h, 8, 2, 0, 0, 0)) ..
      chunk("IDAT", "\x78\x9c\x03\x00\x00\x00\x00\x01") .. chunk("IEND", "")
  end
  cases[#cases + 1] = {"a PNG 0 pixels wide", png_of(0, 5), "png", "a png image of size 0x5 (nothing to decode)"}
  cases[#cases + 1] = {"a PNG of 2147483647 x 1", png_of(2147483647, 1), "png",
    "a png image 2147483647 pixels wide, more than the limit of 1048576"}
  cases[#cases + 1] = {"a PNG of 1 x 2147483647", png_of(1, 2147483647), "png",
    "1x2147483647 = 2147483647 pixels, more than the limit of 268435456"}
  cases[#cases + 1] = {"a PNG of 65536 x 65536", png_of(65536, 65536), "png",
    "65536x65536 = 4294967296 pixels, more than the limit of 268435456"}
  for i, c in ipairs(cases) do
    local path = W .. "/bad" .. i .. "." .. c[3]
    write_all(path, c[2])
    fails(function() ck.image_load(path) end, {path .. ": ", c[4]}, c[1] .. ": image_load refuses it")
  end
  local t = cases[1]
  local path = W .. "/bad1." .. t[3]
  local ok = pcall(ck.image_info, path)
  T.ok(ok, "image_info of a cut PNG whose header is whole still reads the header")
  fails(function() ck.image_info(W .. "/bad" .. #cases .. ".png") end, "more than the limit",
    "image_info refuses an oversized image from its header")
  fails(function() ck.image_load(W .. "/missing.png") end, W .. "/missing.png: cannot open: No such file",
    "a missing file is refused, naming it")
  fails(function() ck.image_load(W) end, W .. ": not a regular file", "a directory is refused")
  for i = 1, #cases do os.remove(W .. "/bad" .. i .. "." .. cases[i][3]) end
  os.remove(W)
end

T.done()

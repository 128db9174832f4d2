-- Images in log records: ck.log_image values anywhere in a record become
-- TensorBoard image summaries (Summary.Value.image) in the record's event,
-- beside its numbers, and {"width", "height", "png_bytes"} objects in the
-- JSON line; ck.read_events gives back the tags, sizes and bytes exactly, for
-- sync and async loggers and through ck.log's Logger; unknown protobuf fields
-- are skipped; log.rewind keeps working on such logs; bad arguments each give
-- one error line naming this script's line. Last, TensorBoard's own reading of
-- an event file ckrun wrote (tests/data/tb_images/expected.txt, made by
-- tests/ref/make_tb_images.py) equals ckrun's reading of the same records
-- written now.
--
-- `ckrun tests/lua/test_log_images.lua --reference DIR` writes the reference
-- PNGs (tests/data/tb_images/a.png, b.png) and the reference event file in
-- DIR, and nothing else (the reference script runs it).
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local log = require "ck.log"

local DATA = "tests/data/tb_images/"

local function read_all(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- an RGB image array [3, H, W] whose pixels follow from seed
local function pattern(h, w, seed)
  local a = ck.array({3, h, w})
  for i = 1, #a do a:set(i, ((i * seed + 11) % 256) / 127.5 - 1) end
  return a
end

-- The reference records (also written by the ctest from the committed PNGs):
-- two images and a number in one record, an image-only record, images nested
-- and in a list; a record of text only (no event).
local function reference_records(lg, A, B)
  lg:write{step = 1, loss = 0.5, samples = {a = A, b = B}}
  lg:write{step = 2, preview = B}
  lg:write{step = 3, grid = {A, B}, nested = {deep = {img = A, lr = 0.25}}}
  lg:write{step = 4, note = "text only: no event"}
end

if args.reference then
  local dir = args.reference
  assert(ck.mkdir(dir))
  ck.write_png(DATA .. "a.png", pattern(6, 8, 37), {text = {parameters = "a red cat, Steps: 4", n = 1}})
  ck.write_png(DATA .. "b.png", pattern(7, 5, 101))
  local lg = ck.log_open{dir = dir, jsonl = false}
  reference_records(lg, ck.log_image(read_all(DATA .. "a.png"), 8, 6), ck.log_image(read_all(DATA .. "b.png"), 5, 7))
  local _, events = lg:paths()
  lg:close()
  print(events)
  return
end

local dir = string.format("out/test_log_images.%d", math.floor(ck.wall_time() * 1000) % 1000000000)
assert(ck.mkdir(dir))

-- f must raise one line naming this script's line and holding want
local function fails(f, want, what)
  local ok, err = pcall(f)
  err = tostring(err)
  T.ok(not ok and err:match("^[^\n]-test_log_images%.lua:%d+: ") ~= nil and err:find(want, 1, true) ~= nil and
    not err:find("\n"), what .. " (" .. err .. ")")
end

-- two real PNGs made here
ck.write_png(dir .. "/a.png", pattern(6, 8, 37), {text = {Comment = "sample a"}})
ck.write_png(dir .. "/b.png", pattern(7, 5, 101))
local pa, pb = read_all(dir .. "/a.png"), read_all(dir .. "/b.png")
local A, B = ck.log_image(pa, 8, 6), ck.log_image(pb, 5, 7)
T.ok(A.width == 8 and A.height == 6 and A.png_bytes == #pa and B.width == 5 and B.png_bytes == #pb,
  "log_image values show their width, height and png_bytes")
T.ok(tostring(A) == string.format("ck.log_image (8x6, %d PNG bytes)", #pa), "tostring names the size: " .. tostring(A))
T.ok(getmetatable(A) == false, "a log image's metatable is its own (getmetatable gives false)")

-- events by step (the file_version event has none of values or images)
local function by_step(events)
  local t = {}
  for i = 2, #events do t[events[i].step] = events[i] end
  return t
end

local function count(t)
  local n = 0
  for _ in pairs(t or {}) do n = n + 1 end
  return n
end

local function same_image(im, png, w, h)
  return im ~= nil and im.width == w and im.height == h and im.colorspace == 3 and im.png == png
end

-- what every logger here should have written for reference_records(lg, A, B)
local function check_reference_events(events, tail, what)
  T.ok(events and #events == 4 and tail == 0 and events[1].file_version == "brain.Event:2",
    what .. ": file_version and an event per record with numbers or images (none for text only): " ..
    tostring(events and #events))
  if not events then return end
  local s = by_step(events)
  local e1, e2, e3 = s[1], s[2], s[3]
  T.ok(e1 and e1.values and e1.values.loss == 0.5 and count(e1.values) == 1 and count(e1.images) == 2 and
    same_image(e1.images["samples/a"], pa, 8, 6) and same_image(e1.images["samples/b"], pb, 5, 7),
    what .. ": two images and a number in one event, tags samples/a and samples/b, sizes and bytes exact")
  T.ok(e2 and e2.values == nil and count(e2.images) == 1 and same_image(e2.images.preview, pb, 5, 7),
    what .. ": an image-only record is an event with only its image")
  T.ok(e3 and count(e3.images) == 3 and same_image(e3.images["grid/1"], pa, 8, 6) and
    same_image(e3.images["grid/2"], pb, 5, 7) and same_image(e3.images["nested/deep/img"], pa, 8, 6) and
    e3.values and e3.values["nested/deep/lr"] == 0.25 and count(e3.values) == 1,
    what .. ": nested and listed images are tagged by path (grid/1, nested/deep/img) beside nested numbers")
end

-- ---- sync: the event file and the JSON lines
do
  local lg = ck.log_open{dir = dir}
  reference_records(lg, A, B)
  local jsonl, events = lg:paths()
  lg:close()
  local ev, tail = ck.read_events(events)
  check_reference_events(ev, tail, "sync")
  local lines = {}
  for line in io.lines(jsonl) do lines[#lines + 1] = line end
  T.ok(#lines == 4, "one JSON line per record (4): " .. #lines)
  local r1, r2, r3 = ck.json_decode(lines[1]), ck.json_decode(lines[2]), ck.json_decode(lines[3])
  local want_a = string.format('{"width":8,"height":6,"png_bytes":%d}', #pa)
  local want_b = string.format('{"width":5,"height":7,"png_bytes":%d}', #pb)
  T.ok(lines[1]:find('"samples":{"a":' .. want_a .. ',"b":' .. want_b .. '}', 1, true) ~= nil and r1.loss == 0.5,
    "metrics.jsonl: an image is {\"width\",\"height\",\"png_bytes\"} in that order: " .. lines[1])
  T.ok(r2.preview.width == 5 and r2.preview.height == 7 and r2.preview.png_bytes == #pb and count(r2) == 3,
    "an image-only record's line holds step, time and the image's object")
  T.ok(r3.grid[1].png_bytes == #pa and r3.grid[2].width == 5 and r3.nested.deep.img.height == 6 and
    r3.nested.deep.lr == 0.25, "nested and listed images in the line")
  local raw = read_all(jsonl)
  T.ok(not raw:find("PNG", 1, true) and not raw:find("IHDR", 1, true), "the PNG bytes stay out of metrics.jsonl")

  -- log.rewind on a log that holds images: steps after 2 dropped, the rest whole
  local before = read_all(events)
  log.rewind(dir, 2)
  local kept = {}
  for line in io.lines(jsonl) do kept[#kept + 1] = line end
  T.ok(#kept == 2 and kept[1] == lines[1] and kept[2] == lines[2], "log.rewind(dir, 2) keeps the lines of steps 1 and 2 as they were")
  T.ok(read_all(events) == before, "log.rewind leaves the event file alone")
  local lg2 = ck.log_open{dir = dir, tensorboard = false}
  lg2:write{step = 3, preview = A}
  lg2:close()
  local n, last = 0, nil
  for line in io.lines(jsonl) do n, last = n + 1, line end
  T.ok(n == 3 and ck.json_decode(last).preview.width == 8, "a resumed run appends its image records after the rewind")
end

-- ---- async: the record owns its copy of the bytes
do
  local lg = ck.log_open{dir = dir, jsonl = false, async = true, queue = 2, flush_interval = 30}
  -- values made and dropped at once: only the records' copies are left when the writer runs
  for s = 1, 6 do
    lg:write{step = s, img = ck.log_image(s % 2 == 1 and pa or pb, s % 2 == 1 and 8 or 5, s % 2 == 1 and 6 or 7),
             n = s}
    collectgarbage("collect")
  end
  lg:flush()
  local submitted, written = lg:counts()
  local _, events = lg:paths()
  lg:close()
  local ev, tail = ck.read_events(events)
  local all = ev and #ev == 7 and tail == 0 and submitted == 6 and written == 6
  for s = 1, 6 do
    local e = ev and ev[s + 1]
    local odd = s % 2 == 1
    all = all and e.step == s and e.values.n == s and
      same_image(e.images.img, odd and pa or pb, odd and 8 or 5, odd and 6 or 7)
  end
  T.ok(all, "async (a queue of 2): 6 image records written whole, bytes exact, after their values were collected")
  local lg2 = ck.log_open{dir = dir, jsonl = false, async = true}
  reference_records(lg2, A, B)
  local _, events2 = lg2:paths()
  lg2:close()
  check_reference_events(ck.read_events(events2), 0, "async")
end

-- ---- ck.log's Logger: records held until the files open, then written
do
  local d = dir .. "/logger"
  local lgr = log.new{dir = d, progress = false}
  lgr:write{step = 1, sample = A, loss = 2}
  local paths = lgr:close()
  local ev = ck.read_events(paths.events)
  T.ok(ev and #ev == 2 and same_image(ev[2].images.sample, pa, 8, 6) and ev[2].values.loss == 2,
    "Logger:write carries images to the event file")
  local line = read_all(paths.jsonl)
  T.ok(line:find(string.format('"sample":{"width":8,"height":6,"png_bytes":%d}', #pa), 1, true) ~= nil,
    "and to metrics.jsonl")
end

-- ---- reading: unknown fields are skipped
do
  local function varint(v)
    local t = {}
    repeat
      local b = v & 0x7f
      v = v >> 7
      t[#t + 1] = string.char(v ~= 0 and b | 0x80 or b)
    until v == 0
    return table.concat(t)
  end
  local function field(n, wire, payload)
    if wire == 2 then return varint(n << 3 | 2) .. varint(#payload) .. payload end
    return varint(n << 3 | wire) .. payload
  end
  local image = field(1, 0, varint(7)) .. field(9, 2, "unknown bytes") .. field(2, 0, varint(5)) ..
    field(3, 0, varint(3)) .. field(4, 2, pb) .. field(15, 0, varint(300))
  local value = field(1, 2, "custom/img") .. field(9, 2, "metadata we do not read") .. field(4, 2, image)
  local number = field(7, 2, "node") .. field(1, 2, "x") .. field(2, 5, string.pack("<f", 1.5))
  local summary = field(1, 2, value) .. field(1, 2, number) .. field(3, 2, "unknown")
  local event = field(1, 1, string.pack("<d", 123.5)) .. field(2, 0, varint(9)) .. field(11, 2, "??") ..
    field(5, 2, summary)
  local function frame(data)
    local head = string.pack("<I8", #data)
    local _, mh = ck.crc32c(head)
    local _, md = ck.crc32c(data)
    return head .. string.pack("<I4", mh) .. data .. string.pack("<I4", md)
  end
  local path = dir .. "/crafted.tfevents"
  local f = assert(io.open(path, "wb"))
  f:write(frame(event))
  f:close()
  local ev, err = ck.read_events(path)
  local e = ev and ev[1]
  T.ok(e and e.step == 9 and e.wall_time == 123.5 and same_image(e.images["custom/img"], pb, 5, 7) and
    e.values.x == 1.5 and count(e.values) == 1, "an Event with unknown fields in Event, Summary, Value and Image " ..
    "reads as its image and its number (" .. tostring(err) .. ")")
end

-- ---- bad arguments: one error line each, naming this line
do
  fails(function() ck.log_image(nil, 8, 6) end, "log_image: png_bytes must be a string", "png_bytes nil")
  fails(function() ck.log_image(42, 8, 6) end, "png_bytes must be a string (the bytes of a PNG file), got number",
    "png_bytes a number")
  fails(function() ck.log_image("GIF89a not a png at all", 8, 6) end, "png_bytes is not a PNG", "bytes without the PNG signature")
  fails(function() ck.log_image("", 8, 6) end, "png_bytes is not a PNG (0 bytes", "an empty string")
  fails(function() ck.log_image(pa:sub(1, 8) .. "xxxx", 8, 6) end, "no IHDR header", "a signature without IHDR")
  fails(function() ck.log_image(pa, 0, 6) end, "width must be an integer from 1 to 65535, got 0", "width 0")
  fails(function() ck.log_image(pa, -8, 6) end, "width must be an integer from 1 to 65535, got -8", "a negative width")
  fails(function() ck.log_image(pa, 8.5, 6) end, "width must be an integer from 1 to 65535, got 8.5", "a fractional width")
  fails(function() ck.log_image(pa, 8, 65536) end, "height must be an integer from 1 to 65535, got 65536", "height 65536")
  fails(function() ck.log_image(pa, 8, "6") end, "height must be an integer from 1 to 65535, got string", "height a string")
  fails(function() ck.log_image(pa, 8) end, "height must be an integer from 1 to 65535, got no value", "height missing")
  fails(function() ck.log_image(pa, 6, 8) end, "the PNG is 8x6, not the 6x8 given", "sizes that are not the PNG's")
  T.ok(ck.log_image(pa, 8.0, 6.0).width == 8, "sizes given as whole floats are accepted")
  local big = pa:sub(1, 33) .. string.rep("\0", 64 * 1024 * 1024 - 32)
  fails(function() ck.log_image(big, 8, 6) end, "more than the 64 MiB a log image holds", "a PNG over 64 MiB")
  big = nil
  collectgarbage("collect")
  local lg = ck.log_open{dir = dir, jsonl_name = "bad.jsonl", tensorboard = false}
  fails(function() lg:write{step = 1, img = ck.array({3, 2, 2})} end, "log record: 'img' is a userdata", "an array in a record")
  fails(function() lg:write{step = 1, nested = {bad = io.stdout}} end, "ck.log_image values", "a file in a record")
  lg:write{step = 2, img = A}
  lg:close()
  local n = 0
  for _ in io.lines(dir .. "/bad.jsonl") do n = n + 1 end
  T.ok(n == 1, "records refused write nothing; the next one is written (" .. n .. " line)")
end

-- ---- TensorBoard's reading of the reference records (tests/ref/make_tb_images.py)
do
  local ra, rb = read_all(DATA .. "a.png"), read_all(DATA .. "b.png")
  local lg = ck.log_open{dir = dir, jsonl = false}
  reference_records(lg, ck.log_image(ra, 8, 6), ck.log_image(rb, 5, 7))
  local _, events = lg:paths()
  lg:close()
  local ev = assert(ck.read_events(events))
  local images, scalars = {}, {}
  for i = 2, #ev do
    local e = ev[i]
    for tag, im in pairs(e.images or {}) do
      images[#images + 1] = {tag = tag, step = e.step, im = im}
    end
    for tag, v in pairs(e.values or {}) do scalars[#scalars + 1] = {tag = tag, step = e.step, v = v} end
  end
  local function order(a, b) return a.tag < b.tag or (a.tag == b.tag and a.step < b.step) end
  table.sort(images, order)
  table.sort(scalars, order)
  local got = {}
  for _, x in ipairs(images) do
    got[#got + 1] = string.format("image %s step=%d width=%d height=%d bytes=%d sha256=%s", x.tag, x.step,
      x.im.width, x.im.height, #x.im.png, ck.sha256(x.im.png))
  end
  for _, x in ipairs(scalars) do got[#got + 1] = string.format("scalar %s step=%d value=%.9g", x.tag, x.step, x.v) end
  for _, x in ipairs(images) do
    got[#got + 1] = string.format("plugin images %s step=%d width=%d height=%d sha256=%s", x.tag, x.step,
      x.im.width, x.im.height, ck.sha256(x.im.png))
  end
  local want = {}
  for line in io.lines(DATA .. "expected.txt") do
    if line:sub(1, 1) ~= "#" and line ~= "" then want[#want + 1] = line end
  end
  local first_diff
  for i = 1, math.max(#got, #want) do
    if got[i] ~= want[i] then
      first_diff = string.format("line %d: ckrun %s, tensorboard %s", i, tostring(got[i]), tostring(want[i]))
      break
    end
  end
  T.ok(#want == 14 and first_diff == nil, string.format(
    "ckrun reads the reference records as TensorBoard read them (%d lines: image tags, steps, sizes, sha256; " ..
    "scalars; the Images tab's tensors)%s", #want, first_diff and ("; " .. first_diff) or ""))
end

T.done()

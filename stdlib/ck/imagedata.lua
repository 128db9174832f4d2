-- The image dataset as kohya-ss/sd-scripts reads it: a folder of images with
-- caption files, N_concept subfolders repeated N times, aspect-ratio buckets,
-- the resize and crop that fit an image to its bucket, SDXL's time ids, the
-- per-use caption (shuffle, keep tokens, dropout), batches drawn one bucket at
-- a time, and the keys that name an image's cached latents.
--
-- What differs from kohya, on purpose:
--   * images directly in the scanned folder are read too, repeated once (kohya
--     reads only its N_concept subfolders); folders without a leading repeat
--     count, or with a count below 1, are skipped with a warning, as kohya does
--   * the caption file is <stem>.txt (caption_extension); when that is the
--     default ".txt" and no such file exists, kohya's <stem>.caption is read
--   * an empty caption file is an empty caption (kohya stops on it); a caption
--     file that is not UTF-8 is refused naming the file; a leading BOM is dropped
--   * an image narrower or shorter than the smallest bucket side (min; the
--     resolution without bucketing) is refused rather than upscaled
--   * randomness comes from ck.random, keyed by (seed, epoch, what, index), so
--     a run is reproducible sample by sample
--   * without bucketing an image is resized to cover the resolution and
--     center-cropped, as kohya's latent-caching path does (its uncached path
--     only crops, and asks for images at least that large)
--   * the time ids' crop is kohya's (get_crop_ltrb: where the image would sit
--     if fitted inside the bucket), not the offset of the crop actually made;
--     a random crop keeps the centered crop's time ids, as kohya does
--
--   local imagedata = require "ck.imagedata"
--   local set = imagedata.scan("train", {caption_extension = ".txt"})
--   local plan = imagedata.assign(set, imagedata.buckets{resolution = 1024, enable = true, max = 2048})
--   local use = 0 -- tells the uses of an epoch apart (an image repeats)
--   for _, bt in ipairs(imagedata.batches(plan, {batch = 4, seed = 1, epoch = 0})) do
--     for _, i in ipairs(bt.entries) do
--       local e = plan.items[i]
--       use = use + 1
--       local s = imagedata.sample(e, {flip_aug = true, seed = 1, epoch = 0, index = use})
--       local key = imagedata.cache_key(e, {crop = s.crop, flip = s.flip, model_id = "sdxl-vae"})
--       local path = imagedata.cache_path(e, "cache", key) -- encode ck.image_load(e.path,
--       -- {resize = e.resized, crop = s.crop, flip = s.flip}) there unless it exists
--       local text = imagedata.caption(e.caption, {shuffle = true, keep_tokens = 1, seed = 1, epoch = 0, index = use})
--     end
--   end
local ck = require "ck"

local M = {}

M.IMAGE_EXTENSIONS = {png = true, jpg = true, jpeg = true, webp = true}

-- keys of the counter-based generator, one per kind of draw
local KEY_CAPTION = 0x1CA0 << 40
local KEY_CROP = 0x1CA1 << 40
local KEY_FLIP = 0x1CA2 << 40
local KEY_BUCKET = 0x1CA3 << 40
local KEY_BATCHES = 0x1CA4 << 40

local CACHE_VERSION = "ckrun image latent cache 1"

-- Errors: raised inside as a marked table, turned at the public function into
-- one line with the caller's position; any other error (an interrupt, a
-- limit) passes through unchanged.
local Fail = {}
local function fail(fmt, ...)
  error(setmetatable({msg = string.format(fmt, ...)}, Fail), 0)
end

local function public(name, fn)
  return function(...)
    local r = table.pack(pcall(fn, ...))
    if r[1] then return table.unpack(r, 2, r.n) end
    local e = r[2]
    if getmetatable(e) == Fail then error("imagedata." .. name .. ": " .. e.msg, 2) end
    error(e, 0)
  end
end

local function default_warn(msg)
  if io.stderr then io.stderr:write("warning: ", msg, "\n") else print("warning: " .. msg) end
end

local function rawopt(t, k, default)
  if t == nil then return default end
  local v = rawget(t, k)
  if v == nil then return default end
  return v
end

local function check_int(v, what, lo)
  if math.type(v) ~= "integer" and not (type(v) == "number" and v == math.floor(v) and v == v) then
    fail("%s must be a whole number, got %s", what, tostring(v))
  end
  v = math.tointeger(v)
  if v == nil or (lo and v < lo) then fail("%s must be at least %d, got %s", what, lo, tostring(v)) end
  return v
end

-- a {w, h} pair from a number (square) or a two-number list
local function size_opt(v, what)
  if type(v) == "number" then
    local n = check_int(v, what, 1)
    return {n, n}
  end
  if type(v) ~= "table" then fail("%s must be a size {width, height} or a number", what) end
  return {check_int(rawget(v, 1), what .. "[1] (width)", 1), check_int(rawget(v, 2), what .. "[2] (height)", 1)}
end

local function plain_split(s, sep)
  local out, pos = {}, 1
  while true do
    local a, b = s:find(sep, pos, true)
    if not a then break end
    out[#out + 1] = s:sub(pos, a - 1)
    pos = b + 1
  end
  out[#out + 1] = s:sub(pos)
  return out
end

-- s without its leading and trailing white space, in time linear in #s (the
-- patterns "^%s*(.-)%s*$" and "%s+$" backtrack over a run of spaces from
-- each of its characters: minutes for a 100 KB caption)
local function strip(s)
  local a = s:find("%S")
  return a and s:match(".*%S", a) or ""
end
M.strip = strip

local function extension(name)
  local ext = name:match("%.([^.]+)$")
  return ext and ext:lower()
end

-- "the rest of a message" without a leading "file:line: " position
local function unplaced(msg)
  msg = tostring(msg)
  return msg:match("^[^:\n]+:%d+: (.*)$") or msg
end

------------------------------------------------------------------------------
-- scan

local function read_caption(path)
  local f, err = io.open(path, "rb")
  if not f then
    if err and err:find("No such file", 1, true) then return nil end
    fail("cannot read caption file '%s': %s", path, unplaced(err))
  end
  local s = f:read("a")
  f:close()
  if s == nil then fail("cannot read caption file '%s'", path) end
  if s:sub(1, 3) == "\239\187\191" then s = s:sub(4) end
  local ok, bad = utf8.len(s)
  if not ok then fail("caption file '%s' is not valid UTF-8 (byte %d)", path, bad) end
  -- the first line (as Python's text mode reads lines: \n, \r\n or \r ends one)
  return strip(s:match("^[^\r\n]*"))
end

-- The caption of an image: <stem><ext>, then (for the default .txt, unless
-- exact: a dataset config's caption_extension, which kohya reads alone) <stem>.caption.
local function find_caption(dir, stem, ext, exact)
  local tried = {dir .. "/" .. stem .. ext}
  if ext == ".txt" and not exact then tried[2] = dir .. "/" .. stem .. ".caption" end
  for _, p in ipairs(tried) do
    local c = read_caption(p)
    if c then return c, p, tried end
  end
  return nil, nil, tried
end

-- N_concept -> N, concept; a name without a leading whole number -> nil
local function repeats_of(name)
  local n, rest = name:match("^([+-]?%d+)_(.*)$")
  if not n then n, rest = name:match("^([+-]?%d+)$"), "" end
  if not n then return nil end
  return math.tointeger(tonumber(n)) or 0, rest
end

local function images_in(dir, names)
  local out = {}
  for _, name in ipairs(names) do
    local ext = extension(name)
    if ext and M.IMAGE_EXTENSIONS[ext] then out[#out + 1] = name end
  end
  return out
end

-- imagedata.scan(dir, {caption_extension = ".txt", info = fn, warn = fn}) -> set
--   every image (png, jpg, jpeg, webp in any case) in dir (repeated once) and
--   in its N_concept folders (repeated N times), sorted by path; each item:
--   {index, path, name, stem, folder, repeats, class_tokens, caption,
--   caption_path, width, height, format}. info(path) -> {width=, height=,
--   format=} (ck.image_info by default) gives sizes; warn(message) gets each
--   warning (a skipped folder; once per image, a missing caption). set =
--   {dir, items, count (images with repeats)}. With flat = true (a subset of
--   kohya's --dataset-config: its image_dir), the images directly in dir
--   alone, each repeated `repeats` times (default 1), an image without a
--   caption file captioned `class_tokens` (default ""), and no images is an
--   empty set, not an error.
local function scan(dir, opts)
  if type(dir) ~= "string" then fail("the folder must be a string, got %s", type(dir)) end
  if opts ~= nil and type(opts) ~= "table" then fail("options must be a table") end
  local ext = rawopt(opts, "caption_extension", ".txt")
  if type(ext) ~= "string" or ext == "" then fail("caption_extension must be a non-empty string") end
  if ext:sub(1, 1) ~= "." then ext = "." .. ext end
  local info = rawopt(opts, "info", rawget(ck, "image_info"))
  if info == nil then fail("no image size reader: pass info = function(path) (ck.image_info is not built in)") end
  local warn = rawopt(opts, "warn", default_warn)
  local flat = rawopt(opts, "flat", false)
  local own_repeats = flat and check_int(rawopt(opts, "repeats", 1), "repeats", 1) or 1
  local own_class = flat and rawopt(opts, "class_tokens", "") or ""
  if type(own_class) ~= "string" then fail("class_tokens must be a string") end
  dir = dir:gsub("(.)/+$", "%1")

  local names, err = ck.listdir(dir)
  if not names then fail("%s", err) end
  -- the folders to read: dir itself, then (unless flat) its N_concept folders
  local folders = {{path = dir, folder = "", repeats = own_repeats, class_tokens = own_class, names = names}}
  for _, name in ipairs(flat and {} or names) do
    local ext_of = extension(name)
    if not (ext_of and M.IMAGE_EXTENSIONS[ext_of]) then
      local sub = dir .. "/" .. name
      local subnames = ck.listdir(sub)
      if subnames then
        local n, concept = repeats_of(name)
        if n == nil then
          warn(string.format("imagedata: skipping folder '%s': its name has no repeat count (N_concept)", sub))
        elseif n < 1 then
          warn(string.format("imagedata: skipping folder '%s': repeat count %d is below 1", sub, n))
        else
          folders[#folders + 1] = {path = sub, folder = name, repeats = n, class_tokens = concept, names = subnames}
        end
      end
    end
  end

  local items, count = {}, 0
  for fi, fo in ipairs(folders) do
    local imgs = images_in(fo.path, fo.names)
    if #imgs == 0 and fi > 1 then
      warn(string.format("imagedata: skipping folder '%s': no images", fo.path))
    end
    for _, name in ipairs(imgs) do
      local path = fo.path .. "/" .. name
      local stem = name:match("^(.*)%.[^.]+$")
      local caption, cpath, tried = find_caption(fo.path, stem, ext, flat)
      if caption == nil then
        if fo.class_tokens ~= "" then
          caption = fo.class_tokens
          warn(string.format("imagedata: no caption for '%s' (no %s): using the class tokens '%s'",
                             path, table.concat(tried, " or "), caption))
        else
          caption = ""
          warn(string.format("imagedata: no caption for '%s' (no %s): using an empty caption",
                             path, table.concat(tried, " or ")))
        end
      end
      local ok, r = pcall(info, path)
      if not ok then
        if getmetatable(r) == Fail then error(r, 0) end
        local m = unplaced(r)
        if m:find(path, 1, true) then fail("%s", m) end
        fail("'%s': %s", path, m)
      end
      if type(r) ~= "table" then fail("'%s': the image size reader returned %s, not a table", path, type(r)) end
      local w, h = rawget(r, "width"), rawget(r, "height")
      if math.type(w) ~= "integer" or math.type(h) ~= "integer" or w < 1 or h < 1 then
        fail("'%s': the image size reader gave %s x %s, not a size", path, tostring(w), tostring(h))
      end
      items[#items + 1] = {
        path = path, name = name, stem = stem, folder = fo.folder, repeats = fo.repeats,
        class_tokens = fo.class_tokens, caption = caption, caption_path = cpath,
        width = w, height = h, format = rawget(r, "format"),
      }
      count = count + fo.repeats
    end
  end
  if #items == 0 and not flat then
    fail("'%s' has no images (png, jpg, jpeg or webp), neither in it nor in N_concept folders", dir)
  end
  table.sort(items, function(a, b) return a.path < b.path end)
  for i, it in ipairs(items) do it.index = i end
  return {dir = dir, items = items, count = count}
end
M.scan = public("scan", scan)

-- imagedata.reg_repeats(train_count, repeats) -> list: how often each
--   regularization image is used in an epoch, as kohya's DreamBooth dataset
--   balances them against its train images (train_count: the train images
--   with their repeats; repeats: each reg image's own, in order). The images
--   are taken in order with their own repeats until the uses reach
--   train_count (the rest get 0: unused); while the first pass falls short,
--   further passes add one use to each in turn until it does.
M.reg_repeats = public("reg_repeats", function(train_count, repeats)
  train_count = check_int(train_count, "train_count", 0)
  if type(repeats) ~= "table" then fail("repeats must be a list of whole numbers") end
  local out, n = {}, 0
  for i, r in ipairs(repeats) do
    check_int(r, "repeats[" .. i .. "]", 1)
    out[i] = 0
  end
  if #repeats == 0 then return out end
  local first = true
  while n < train_count do
    for i, r in ipairs(repeats) do
      if first then
        out[i], n = r, n + r
      else
        out[i], n = out[i] + 1, n + 1
      end
      if n >= train_count then break end
    end
    first = false
  end
  return out
end)

------------------------------------------------------------------------------
-- buckets

-- kohya's make_bucket_resolutions: the square of the resolution's area, then
-- for each width from min up to max by steps, the tallest height (a multiple
-- of steps, at most max) within the area, and its transpose; sorted.
local function bucket_list(res, min, max, steps)
  local area = res[1] * res[2]
  local seen, list = {}, {}
  local function add(w, h)
    local k = w .. "x" .. h
    if not seen[k] then
      seen[k] = true
      list[#list + 1] = {w, h}
    end
  end
  local side = math.floor(math.sqrt(area) / steps) * steps
  -- Python: int(math.sqrt(area) // steps) * steps, the floor of a float quotient
  add(side, side)
  local w = min
  while w <= max do
    local h = math.min(max, (area // w) // steps * steps)
    if h >= min then
      add(w, h)
      add(h, w)
    end
    w = w + steps
  end
  table.sort(list, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  return list
end

-- imagedata.buckets{resolution = {w, h} | n, enable = false, min = 256,
--   max = 1024, steps = 64, no_upscale = false} -> buckets
--   {resolution, enable, no_upscale, min, max, steps, list = {{w, h}, ...}}:
--   list is kohya's bucket list (sorted by width, then height); with
--   no_upscale, buckets are each image's size (scaled down to the area when
--   larger) rounded down to steps (list is empty); without enable, the one
--   bucket is the resolution. Images smaller than their bucket are scaled up
--   to cover it, as kohya does, except with no_upscale.
local function buckets(o)
  if type(o) ~= "table" then fail("options must be a table {resolution = ...}") end
  local res = size_opt(rawopt(o, "resolution", nil), "resolution")
  local enable = rawopt(o, "enable", false) and true or false
  local b = {resolution = res, enable = enable, no_upscale = false, area = res[1] * res[2]}
  if not enable then
    b.list = {{res[1], res[2]}}
    return b
  end
  b.min = check_int(rawopt(o, "min", 256), "min (min_bucket_reso)", 1)
  b.max = check_int(rawopt(o, "max", 1024), "max (max_bucket_reso)", 1)
  b.steps = check_int(rawopt(o, "steps", 64), "steps (bucket_reso_steps)", 1)
  b.no_upscale = rawopt(o, "no_upscale", false) and true or false
  if b.max < res[1] or b.max < res[2] then
    fail("max (max_bucket_reso) %d is below the resolution %dx%d", b.max, res[1], res[2])
  end
  if b.max < b.min then fail("max (max_bucket_reso) %d is below min %d", b.max, b.min) end
  b.list = b.no_upscale and {} or bucket_list(res, b.min, b.max, b.steps)
  return b
end
M.buckets = public("buckets", buckets)

local function round_to_steps(x, steps)
  local n = math.floor(x + 0.5)
  return n - n % steps
end

-- kohya's select_bucket: the bucket, and the size the image is resized to
-- before the crop (it covers the bucket). Upscaling: the bucket of the image's
-- own size if there is one, else the first with the nearest aspect ratio; the
-- image is scaled so its short side (relative to the bucket) fits. No
-- upscaling: an image over the area is scaled down to it, keeping its aspect
-- ratio, with one side rounded to steps (whichever keeps the ratio closer);
-- the bucket is that size rounded down to steps.
local function select(b, w, h)
  local ar = w / h
  if not b.no_upscale then
    local reso
    for _, r in ipairs(b.list) do
      if r[1] == w and r[2] == h then reso = r break end
    end
    if not reso then
      local best
      for _, r in ipairs(b.list) do
        local e = math.abs(r[1] / r[2] - ar)
        if best == nil or e < best then best, reso = e, r end
      end
    end
    local scale
    if ar > reso[1] / reso[2] then scale = reso[2] / h else scale = reso[1] / w end
    return {reso[1], reso[2]}, {math.floor(w * scale + 0.5), math.floor(h * scale + 0.5)}
  end
  local rw, rh
  if w * h > b.area then
    local fw = math.sqrt(b.area * ar)
    local fh = b.area / fw
    local bw = round_to_steps(fw, b.steps)
    local bh_w = round_to_steps(bw / ar, b.steps)
    local ar_w = bw / bh_w
    local bh = round_to_steps(fh, b.steps)
    local bw_h = round_to_steps(bh * ar, b.steps)
    local ar_h = bw_h / bh
    if math.abs(ar_w - ar) < math.abs(ar_h - ar) then
      rw, rh = bw, math.floor(bw / ar + 0.5)
    else
      rw, rh = math.floor(bh * ar + 0.5), bh
    end
  else
    rw, rh = w, h
  end
  return {rw - rw % b.steps, rh - rh % b.steps}, {rw, rh}
end

-- imagedata.select(buckets, width, height) -> bucket {w, h}, resized {w, h}
-- (kohya's choice; no refusal here)
M.select = public("select", function(b, w, h)
  return select(b, check_int(w, "width", 1), check_int(h, "height", 1))
end)

-- Python's int() of a float: toward zero
local function trunc(x)
  return x >= 0 and math.floor(x) or math.ceil(x)
end

-- SDXL's time ids as kohya computes them (BucketManager.get_crop_ltrb): the
-- crop is where an image of the original aspect ratio, fitted inside the
-- bucket, would sit centered in it; a flipped image's left is the bucket
-- width less that fit's right edge. {orig_h, orig_w, crop_top, crop_left,
-- target_h, target_w}
local function time_ids(bw, bh, w, h, flip)
  local bar, iar = bw / bh, w / h
  local fw, fh
  if bar > iar then fw, fh = bh * iar, bh else fw, fh = bw, bw / iar end
  local left, top = math.floor((bw - fw) / 2), math.floor((bh - fh) / 2)
  if flip then left = bw - (left + fw) end
  return {h, w, trunc(top), trunc(left), bh, bw}
end

-- The refusal of an image too small for its bucket, or nil. As kohya, an
-- image smaller than its bucket (or than the resolution without bucketing)
-- is scaled up to cover it; with no_upscale (where kohya ignores min and max)
-- the bucket is the image's size rounded down to steps, and an image with a
-- side below steps has none: kohya fails on it, ckrun refuses it.
local function too_small(b, it, bucket)
  if bucket[1] < 1 or bucket[2] < 1 then
    return string.format("image '%s' (%dx%d) has a side below --bucket-reso-steps %d, so with --bucket-no-upscale " ..
                         "it has no bucket: refused", it.path, it.width, it.height, b.steps)
  end
  return nil
end

-- imagedata.assign(set, buckets) -> plan: plan.items[i] is set.items[i] with
-- bucket = {w, h}, resized = {w, h}, crop = {top, left, h, w} (the centered
-- crop of the resized image, as ck.image_load's options take it), time_ids
-- and time_ids_flip (6 numbers each); plan.shapes: the buckets in use, sorted
-- {w, h}; plan.by_shape["WxH"]: the item indices in that bucket.
local function assign(set, b)
  if type(set) ~= "table" or type(rawget(set, "items")) ~= "table" then fail("the first argument must be a set from imagedata.scan") end
  if type(b) ~= "table" or type(rawget(b, "list")) ~= "table" then fail("the second argument must be buckets from imagedata.buckets") end
  local items, shapes, by_shape = {}, {}, {}
  for i, it in ipairs(set.items) do
    local bucket, resized = select(b, it.width, it.height)
    local why = too_small(b, it, bucket)
    if why then fail("%s", why) end
    if resized[1] < bucket[1] or resized[2] < bucket[2] then
      fail("image '%s': resized %dx%d does not cover its bucket %dx%d", it.path, resized[1], resized[2], bucket[1], bucket[2])
    end
    local e = {}
    for k, v in pairs(it) do e[k] = v end
    e.bucket, e.resized = bucket, resized
    e.crop = {(resized[2] - bucket[2]) // 2, (resized[1] - bucket[1]) // 2, bucket[2], bucket[1]}
    e.time_ids = time_ids(bucket[1], bucket[2], it.width, it.height, false)
    e.time_ids_flip = time_ids(bucket[1], bucket[2], it.width, it.height, true)
    items[i] = e
    local k = bucket[1] .. "x" .. bucket[2]
    if not by_shape[k] then
      by_shape[k] = {}
      shapes[#shapes + 1] = {bucket[1], bucket[2]}
    end
    table.insert(by_shape[k], i)
  end
  table.sort(shapes, function(x, y) return x[1] < y[1] or (x[1] == y[1] and x[2] < y[2]) end)
  return {items = items, shapes = shapes, by_shape = by_shape, count = set.count, buckets = b}
end
M.assign = public("assign", assign)

-- imagedata.sample(entry, {random_crop = false, flip_aug = false, seed = 0,
--   epoch = 0, index = entry.index}) -> {crop = {top, left, h, w}, flip,
--   time_ids}: how one use of a plan entry is loaded. A random crop is anywhere
--   in the resized image (kohya keeps the time ids of the centered one); a
--   flip is drawn with probability 1/2. index tells uses apart (a repeat, a
--   batch slot): the same (seed, epoch, index) always gives the same sample.
local function sample(e, o)
  if type(e) ~= "table" or type(rawget(e, "bucket")) ~= "table" then fail("the first argument must be an entry of a plan from imagedata.assign") end
  local seed = check_int(rawopt(o, "seed", 0), "seed")
  local epoch = check_int(rawopt(o, "epoch", 0), "epoch")
  local index = check_int(rawopt(o, "index", e.index or 0), "index")
  local crop = {e.crop[1], e.crop[2], e.crop[3], e.crop[4]}
  if rawopt(o, "random_crop", false) then
    local dh, dw = e.resized[2] - e.bucket[2], e.resized[1] - e.bucket[1]
    crop[1] = math.floor(ck.random(seed, epoch, KEY_CROP + index, 1) * (dh + 1))
    crop[2] = math.floor(ck.random(seed, epoch, KEY_CROP + index, 2) * (dw + 1))
  end
  local flip = rawopt(o, "flip_aug", false) and ck.random(seed, epoch, KEY_FLIP + index, 1) < 0.5 or false
  local ids = flip and e.time_ids_flip or e.time_ids
  return {crop = crop, flip = flip, time_ids = {ids[1], ids[2], ids[3], ids[4], ids[5], ids[6]}}
end
M.sample = public("sample", sample)

------------------------------------------------------------------------------
-- captions

-- imagedata.caption(text, {shuffle = false, keep_tokens = 0,
--   keep_tokens_separator = nil, separator = ",", secondary_separator = nil,
--   dropout_rate = 0, tag_dropout_rate = 0, dropout_every_n_epochs = 0,
--   prefix = nil, suffix = nil, seed = 0, epoch = 0, index = 0}) -> caption
--   kohya's process_caption: prefix and suffix joined with a space; the whole
--   caption dropped (to "") with dropout_rate, or every n-th epoch; else its
--   first line, and when shuffling or dropping tags, its tags (split at
--   separator, trimmed) with the first keep_tokens (or those before
--   keep_tokens_separator, and after a second one) kept in place, the others
--   shuffled, each dropped with tag_dropout_rate, joined with ", ". Draws come
--   from ck.random(seed, epoch, key of index, k).
local function caption(text, o)
  if type(text) ~= "string" then fail("the caption must be a string, got %s", type(text)) end
  if o ~= nil and type(o) ~= "table" then fail("options must be a table") end
  local seed = check_int(rawopt(o, "seed", 0), "seed")
  local epoch = check_int(rawopt(o, "epoch", 0), "epoch")
  local index = check_int(rawopt(o, "index", 0), "index")
  local sep = rawopt(o, "separator", ",")
  if type(sep) ~= "string" or sep == "" then fail("separator must be a non-empty string") end
  local keep = check_int(rawopt(o, "keep_tokens", 0), "keep_tokens", 0)
  local ksep = rawopt(o, "keep_tokens_separator", nil)
  if ksep ~= nil and type(ksep) ~= "string" then fail("keep_tokens_separator must be a string") end
  local sec = rawopt(o, "secondary_separator", nil)
  if sec ~= nil and (type(sec) ~= "string" or sec == "") then fail("secondary_separator must be a non-empty string") end
  local rate = rawopt(o, "dropout_rate", 0)
  local tag_rate = rawopt(o, "tag_dropout_rate", 0)
  for name, v in pairs{dropout_rate = rate, tag_dropout_rate = tag_rate} do
    if type(v) ~= "number" or not (v >= 0 and v <= 1) then fail("%s must be a number from 0 to 1, got %s", name, tostring(v)) end
  end
  local every = check_int(rawopt(o, "dropout_every_n_epochs", 0), "dropout_every_n_epochs", 0)
  local shuffle = rawopt(o, "shuffle", false) and true or false
  local prefix, suffix = rawopt(o, "prefix", nil), rawopt(o, "suffix", nil)

  local k, key = 0, KEY_CAPTION + index
  local function u()
    k = k + 1
    return ck.random(seed, epoch, key, k)
  end
  if prefix and prefix ~= "" then text = tostring(prefix) .. " " .. text end
  if suffix and suffix ~= "" then text = text .. " " .. tostring(suffix) end
  local drop = rate > 0 and u() < rate
  drop = drop or (every > 0 and epoch % every == 0)
  if drop then return "" end
  text = text:match("^[^\n]*")
  if shuffle or tag_rate > 0 then
    local fixed, flex, fixed_suffix = {}, {}, {}
    local function nonempty(part)
      local out = {}
      for _, t in ipairs(plain_split(part, sep)) do
        t = strip(t)
        if t ~= "" then out[#out + 1] = t end
      end
      return out
    end
    if ksep and ksep ~= "" and text:find(ksep, 1, true) then
      local a, b = text:find(ksep, 1, true)
      local fixed_part, flex_part = text:sub(1, a - 1), text:sub(b + 1)
      local c, d = flex_part:find(ksep, 1, true)
      if c then
        fixed_suffix = nonempty(flex_part:sub(d + 1))
        flex_part = flex_part:sub(1, c - 1)
      end
      fixed, flex = nonempty(fixed_part), nonempty(flex_part)
    else
      local tokens = plain_split(strip(text), sep)
      for i, t in ipairs(tokens) do
        t = strip(t)
        if i <= keep then fixed[#fixed + 1] = t else flex[#flex + 1] = t end
      end
    end
    if shuffle then
      for i = #flex, 2, -1 do
        local j = 1 + math.floor(u() * i)
        flex[i], flex[j] = flex[j], flex[i]
      end
    end
    if tag_rate > 0 then
      local kept = {}
      for _, t in ipairs(flex) do
        if u() >= tag_rate then kept[#kept + 1] = t end
      end
      flex = kept
    end
    local all = {}
    for _, list in ipairs{fixed, flex, fixed_suffix} do
      for _, t in ipairs(list) do all[#all + 1] = t end
    end
    text = table.concat(all, ", ")
  end
  if sec then text = table.concat(plain_split(text, sec), sep) end
  return text
end
M.caption = public("caption", caption)

------------------------------------------------------------------------------
-- batches

-- imagedata.batches(plan, {batch = 1, seed = 0, epoch = 0}) -> list of
--   {bucket = {w, h}, entries = {plan item index, ...}}: as kohya, each bucket
--   holds its images repeated by their repeats, shuffled; it is cut into
--   batches of `batch` (the last one may be short); the batches of all buckets
--   are shuffled together. Every draw is keyed by (seed, epoch).
local function batches(plan, o)
  if type(plan) ~= "table" or type(rawget(plan, "shapes")) ~= "table" then fail("the first argument must be a plan from imagedata.assign") end
  local bs = check_int(rawopt(o, "batch", 1), "batch", 1)
  local seed = check_int(rawopt(o, "seed", 0), "seed")
  local epoch = check_int(rawopt(o, "epoch", 0), "epoch")
  local out = {}
  for bi, shape in ipairs(plan.shapes) do
    local list = {}
    for _, i in ipairs(plan.by_shape[shape[1] .. "x" .. shape[2]]) do
      for _ = 1, plan.items[i].repeats do list[#list + 1] = i end
    end
    for i = #list, 2, -1 do
      local j = 1 + math.floor(ck.random(seed, epoch, KEY_BUCKET + bi, i) * i)
      list[i], list[j] = list[j], list[i]
    end
    for s = 1, #list, bs do
      local entries = {}
      for j = s, math.min(s + bs - 1, #list) do entries[#entries + 1] = list[j] end
      out[#out + 1] = {bucket = {shape[1], shape[2]}, entries = entries}
    end
  end
  for i = #out, 2, -1 do
    local j = 1 + math.floor(ck.random(seed, epoch, KEY_BATCHES, i) * i)
    out[i], out[j] = out[j], out[i]
  end
  return out
end
M.batches = public("batches", batches)

------------------------------------------------------------------------------
-- cache keys

-- imagedata.cache_key(entry | path, {bucket = {w, h}, resized = {w, h},
--   crop = {top, left}, flip = false, model_id = string}) -> 64 hex digits:
--   the SHA-256 of the image's bytes, the bucket, the resized size, the crop's
--   top-left, the flip and the model's identity (the VAE that encodes it). A
--   plan entry gives bucket, resized and crop; options override them. Any
--   change to the image or to one of these gives another key.
local function cache_key(e, o)
  local path, bucket, resized, crop
  if type(e) == "table" then
    path, bucket, resized, crop = rawget(e, "path"), rawget(e, "bucket"), rawget(e, "resized"), rawget(e, "crop")
  else
    path = e
  end
  if type(path) ~= "string" then fail("the first argument must be a plan entry or an image path") end
  if o ~= nil and type(o) ~= "table" then fail("options must be a table") end
  bucket = size_opt(rawopt(o, "bucket", bucket), "bucket")
  resized = size_opt(rawopt(o, "resized", resized), "resized")
  crop = rawopt(o, "crop", crop)
  if type(crop) ~= "table" then fail("crop must be {top, left}") end
  local top, left = check_int(rawget(crop, 1), "crop[1] (top)", 0), check_int(rawget(crop, 2), "crop[2] (left)", 0)
  local model = rawopt(o, "model_id", nil)
  if type(model) ~= "string" or model == "" then fail("model_id must be a non-empty string (the encoder's identity)") end
  local digest, err = ck.file_sha256(path)
  if not digest then fail("%s", err) end
  local text = table.concat({
    CACHE_VERSION,
    "image " .. digest,
    string.format("bucket %dx%d", bucket[1], bucket[2]),
    string.format("resized %dx%d", resized[1], resized[2]),
    string.format("crop %d,%d", top, left),
    "flip " .. (rawopt(o, "flip", false) and "1" or "0"),
    "model " .. #model .. ":" .. model,
  }, "\n")
  return ck.sha256(text)
end
M.cache_key = public("cache_key", cache_key)

-- imagedata.cache_path(entry, cache_dir, key) -> cache_dir/<folder>/<stem>_<W>x<H>_<key>.safetensors
--   (the folder level only for images in an N_concept folder)
M.cache_path = public("cache_path", function(e, dir, key)
  if type(e) ~= "table" or type(rawget(e, "stem")) ~= "string" then fail("the first argument must be a plan entry") end
  if type(dir) ~= "string" or dir == "" then fail("the cache folder must be a non-empty string") end
  if type(key) ~= "string" or not key:match("^%x+$") then fail("the key must be a hex string from imagedata.cache_key") end
  local b = e.bucket
  local sub = (e.folder and e.folder ~= "") and (e.folder .. "/") or ""
  local shape = b and string.format("_%dx%d", b[1], b[2]) or ""
  return string.format("%s/%s%s%s_%s.safetensors", (dir:gsub("(.)/+$", "%1")), sub, e.stem, shape, key)
end)

------------------------------------------------------------------------------
-- options

-- The dataset's command-line options, kohya's names with dashes, as entries
-- for ck.options.parse (a training script appends them to its own list).
M.OPTIONS = {
  {"resolution", "list", "1024", "training resolution: W,H or one number for a square"},
  {"enable-bucket", "flag", false, "aspect-ratio buckets (else every image is cropped to the resolution)"},
  {"min-bucket-reso", "integer", 256, "the smallest bucket side", min = 1},
  {"max-bucket-reso", "integer", 1024, "the largest bucket side", min = 1},
  {"bucket-reso-steps", "integer", 64, "bucket sides are multiples of this", min = 1},
  {"bucket-no-upscale", "flag", false, "buckets from each image's own size, never upscaled"},
  {"random-crop", "flag", false, "crop anywhere in the resized image, not at its center"},
  {"flip-aug", "flag", false, "flip half the samples left to right"},
  {"shuffle-caption", "flag", false, "shuffle the caption's tags at each use"},
  {"keep-tokens", "integer", 0, "tags at the caption's start kept in place by the shuffle", min = 0},
  {"caption-dropout-rate", "number", 0, "chance of an empty caption at a use", min = 0, max = 1},
  {"caption-tag-dropout-rate", "number", 0, "chance of dropping each shuffled tag at a use", min = 0, max = 1},
  {"caption-separator", "string", ",", "what separates a caption's tags"},
  {"keep-tokens-separator", "string", "", "tags before it (and after a second one) are kept in place"},
  {"caption-extension", "string", ".txt", "caption files: <image stem><this> (for .txt, else <stem>.caption)"},
}

-- imagedata.settings(o) -> {scan = ..., buckets = ..., caption = ...,
--   sample = ...}: the option tables of scan, buckets, caption and sample
--   from options parsed with M.OPTIONS (read raw, by the dashed names)
M.settings = public("settings", function(o)
  if type(o) ~= "table" then fail("give the parsed options") end
  local function g(k) return rawget(o, k) end
  local res = g("resolution") or {"1024"}
  if type(res) == "string" then res = plain_split(res, ",") end
  if #res < 1 or #res > 2 then fail("resolution must be W,H or one number") end
  local w = math.tointeger(tonumber(res[1]))
  local h = math.tointeger(tonumber(res[2] or res[1]))
  if not w or not h then fail("resolution must be whole numbers, got '%s'", table.concat(res, ",")) end
  local ksep = g("keep-tokens-separator")
  return {
    scan = {caption_extension = g("caption-extension")},
    buckets = {resolution = {w, h}, enable = g("enable-bucket"), min = g("min-bucket-reso"), max = g("max-bucket-reso"),
               steps = g("bucket-reso-steps"), no_upscale = g("bucket-no-upscale")},
    caption = {shuffle = g("shuffle-caption"), keep_tokens = g("keep-tokens"), dropout_rate = g("caption-dropout-rate"),
               tag_dropout_rate = g("caption-tag-dropout-rate"), separator = g("caption-separator"),
               keep_tokens_separator = ksep ~= "" and ksep or nil},
    sample = {random_crop = g("random-crop"), flip_aug = g("flip-aug")},
  }
end)

return M

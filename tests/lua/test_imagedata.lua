-- ck.imagedata reads an image folder as kohya-ss/sd-scripts does: buckets,
-- bucket choice, resize, crop and time ids equal kohya's own BucketManager's
-- (tests/data/imagedata/buckets.json, made by tests/ref/make_bucket_ref.py);
-- ck.sha256 and ck.file_sha256 match FIPS 180-4's vectors and Python's
-- hashlib; the folder scan finds images, N_concept repeats and captions and
-- warns once per missing caption; captions, samples and batches are
-- deterministic by (seed, epoch, index); cache keys change with the image and
-- every setting; bad input fails with one line naming the file and the line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local imagedata = require "ck.imagedata"

local HERE = "tests/lua/test_imagedata.lua:"
local DATA = "tests/data/imagedata/"

local function read(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function write(p, s)
  local f = assert(io.open(p, "wb"))
  f:write(s or "")
  f:close()
end

-- the error message of fn(), or nil when it succeeds (the closures call
-- imagedata without a tail call, so that the error names their line)
local function err_of(fn)
  local ok, e = pcall(fn)
  if ok then return nil end
  return tostring(e)
end

local function same_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- SHA-256 ------------------------------------------------------------------

T.ok(ck.sha256("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "sha256 of the empty string (FIPS 180-4 vector)")
T.ok(ck.sha256("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "sha256 of 'abc'")
T.ok(ck.sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")
     == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", "sha256 of the two-block 448-bit message")
T.ok(ck.sha256(string.rep("a", 1000000)) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
     "sha256 of a million 'a' (past a 64 KiB chunk)")
do
  local want = ck.json_decode(read(DATA .. "sha256.json"))
  local names = {}
  for name in pairs(want) do names[#names + 1] = name end
  table.sort(names)
  T.ok(#names >= 8, "hashlib reference files are there")
  for _, name in ipairs(names) do
    local got = ck.file_sha256(DATA .. name)
    T.ok(got == want[name], "file_sha256 of " .. name .. " equals hashlib's")
    T.ok(ck.sha256(read(DATA .. name)) == want[name], "sha256 of the bytes of " .. name .. " equals hashlib's")
  end
  local none, msg = ck.file_sha256(DATA .. "no_such_file.bin")
  T.ok(none == nil and msg:find("no_such_file.bin", 1, true), "file_sha256 of a missing file: nil and a message naming it")
end

-- buckets, selection, resize, crop, time ids against kohya's code -----------

local cases = ck.json_decode(read(DATA .. "buckets.json"))
T.ok(#cases >= 15, "kohya reference cases are there")
for _, c in ipairs(cases) do
  local name = string.format("res %dx%d min %d max %d steps %d%s%s", c.resolution[1], c.resolution[2], c.min, c.max,
                             c.steps, c.enable and "" or " no bucketing", c.no_upscale and " no upscale" or "")
  local b = imagedata.buckets{resolution = c.resolution, enable = c.enable, min = c.min, max = c.max, steps = c.steps,
                              no_upscale = c.no_upscale}
  if c.buckets ~= ck.json_null and c.buckets ~= nil then
    local ok = #b.list == #c.buckets
    for i = 1, #c.buckets do
      ok = ok and b.list[i] and b.list[i][1] == c.buckets[i][1] and b.list[i][2] == c.buckets[i][2]
    end
    T.ok(ok, name .. ": the bucket list equals kohya's make_buckets (" .. #c.buckets .. " buckets)")
  end
  local matched, refused, wrong = 0, 0, {}
  for _, im in ipairs(c.images) do
    local set = {items = {{path = "img.png", width = im.w, height = im.h, repeats = 1, stem = "img", folder = ""}}, count = 1}
    local ok, plan = pcall(imagedata.assign, set, b)
    local good
    if im.kohya_error then
      -- kohya fails on it (no_upscale: a side below steps has no bucket); ckrun refuses it by name
      good = not ok and tostring(plan):find("img.png", 1, true) and tostring(plan):find("refused", 1, true)
      if good then refused = refused + 1 end
    else
      -- every other size, smaller than its bucket or not, is kohya's bucket, resize, crop and time ids
      local bucket, resized = imagedata.select(b, im.w, im.h)
      good = bucket[1] == im.bucket[1] and bucket[2] == im.bucket[2]
             and resized[1] == im.resized[1] and resized[2] == im.resized[2]
      local e = ok and plan.items[1]
      good = good and ok and e.bucket[1] == im.bucket[1] and e.bucket[2] == im.bucket[2]
             and e.crop[1] == im.crop_top and e.crop[2] == im.crop_left
             and e.crop[3] == im.bucket[2] and e.crop[4] == im.bucket[1]
             and same_list(e.time_ids, im.time_ids) and same_list(e.time_ids_flip, im.time_ids_flip)
      if good then matched = matched + 1 end
    end
    if not good and #wrong < 3 then wrong[#wrong + 1] = im.w .. "x" .. im.h end
  end
  T.ok(#wrong == 0 and matched > 0, string.format("%s: %d image sizes get kohya's bucket, resize, crop and time ids, %d kohya fails on refused%s",
                                                    name, matched, refused, #wrong > 0 and (" (wrong: " .. table.concat(wrong, ", ") .. ")") or ""))
  if c.no_upscale then T.ok(refused > 0, name .. ": sides below steps are among the cases") end
end
-- the sizes smaller than every bucket are among the cases, and scaled up
local up = 0
for _, c in ipairs(cases) do
  for _, im in ipairs(c.images) do
    if not c.no_upscale and im.w == 96 and im.h == 80 and im.resized[1] >= c.buckets[1][1] then up = up + 1 end
  end
end
T.ok(up >= 10, "a 96x80 image is scaled up to its bucket, with bucketing and without (" .. up .. " settings)")

do
  local b = imagedata.buckets{resolution = 1024, enable = true, min = 256, max = 2048}
  local bucket = imagedata.select(b, 1024, 1024)
  T.ok(bucket[1] == 1024 and bucket[2] == 1024, "a square 1024 image gets the 1024x1024 bucket")
  local e = err_of(function() local r = imagedata.buckets{resolution = 1024, enable = true, max = 512}; return r end)
  T.ok(e and e:find(HERE, 1, true) and e:find("max", 1, true), "max below the resolution is refused at the caller's line: " .. tostring(e))
  e = err_of(function() local r = imagedata.buckets{resolution = {0, 512}}; return r end)
  T.ok(e and e:find("resolution", 1, true), "a zero resolution is refused: " .. tostring(e))
end

-- folder scan ---------------------------------------------------------------

local tmp = string.format("out/test_imagedata.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(tmp))
local root = tmp .. "/set"
for _, d in ipairs{root, root .. "/3_cat", root .. "/misc", root .. "/0_none", root .. "/2_empty", root .. "/1_crlf"} do
  assert(ck.mkdir(d))
end
local sizes = {
  ["a.png"] = {1024, 1024}, ["b.JPG"] = {1216, 832}, ["c.webp"] = {832, 1216},
  ["x.jpeg"] = {1500, 1000}, ["y.PNG"] = {640, 480}, ["z.png"] = {700, 700}, ["w.jpg"] = {900, 1400},
}
write(root .. "/a.png", "A")
write(root .. "/a.txt", "\239\187\191  a photo, of, a dog  \nsecond line ignored\n")
write(root .. "/b.JPG", "B")
write(root .. "/b.caption", "kohya caption extension")
write(root .. "/c.webp", "C")
write(root .. "/notes.md", "not an image")
write(root .. "/3_cat/x.jpeg", "X")
write(root .. "/3_cat/y.PNG", "Y")
write(root .. "/3_cat/y.txt", "")
write(root .. "/misc/z.png", "Z")
write(root .. "/0_none/z.png", "Z")
write(root .. "/2_empty/readme.txt", "no images here")
write(root .. "/1_crlf/w.jpg", "W")
write(root .. "/1_crlf/w.txt", "first\r\nsecond")
local calls = 0
local function info(path)
  calls = calls + 1
  local s = sizes[path:match("[^/]+$")]
  if not s then error("no such test image " .. path) end
  return {width = s[1], height = s[2], format = "png"}
end
local warnings = {}
local function warn(m) warnings[#warnings + 1] = m end

local set = imagedata.scan(root, {info = info, warn = warn})
local paths = {}
for i, it in ipairs(set.items) do paths[i] = it.path:sub(#root + 2) end
T.ok(same_list(paths, {"1_crlf/w.jpg", "3_cat/x.jpeg", "3_cat/y.PNG", "a.png", "b.JPG", "c.webp"}),
     "scan finds images of any case in the folder and its N_concept folders, sorted: " .. table.concat(paths, " "))
local by = {}
for _, it in ipairs(set.items) do by[it.path:sub(#root + 2)] = it end
T.ok(by["3_cat/x.jpeg"].repeats == 3 and by["a.png"].repeats == 1 and by["1_crlf/w.jpg"].repeats == 1,
     "repeats come from the folder's N (1 for the folder itself)")
T.ok(set.count == 1 + 3 + 3 + 1 + 1 + 1, "the set counts images with repeats: " .. set.count)
T.ok(by["a.png"].caption == "a photo, of, a dog", "a caption is the first line, trimmed, without a BOM: '" .. by["a.png"].caption .. "'")
T.ok(by["b.JPG"].caption == "kohya caption extension" and by["b.JPG"].caption_path:match("b%.caption$"),
     "without a .txt the .caption file is read")
T.ok(by["3_cat/y.PNG"].caption == "", "an empty caption file is an empty caption")
T.ok(by["1_crlf/w.jpg"].caption == "first", "a CRLF caption's first line: '" .. by["1_crlf/w.jpg"].caption .. "'")
T.ok(by["3_cat/x.jpeg"].caption == "cat" and by["3_cat/x.jpeg"].class_tokens == "cat",
     "a missing caption in an N_concept folder uses the concept (kohya's class tokens)")
T.ok(by["c.webp"].caption == "", "a missing caption elsewhere is empty")
T.ok(by["a.png"].width == 1024 and by["b.JPG"].height == 832, "sizes come from the info function")
T.ok(calls == 6, "info is called once per image: " .. calls)
local function count_warn(pat)
  local n = 0
  for _, w in ipairs(warnings) do if w:find(pat, 1, true) then n = n + 1 end end
  return n
end
T.ok(count_warn("c.webp") == 1 and count_warn("3_cat/x.jpeg") == 1, "one warning per image without a caption")
T.ok(count_warn("a.png") == 0 and count_warn("y.PNG") == 0 and count_warn("b.JPG") == 0, "no warning for images with captions")
T.ok(count_warn("misc") == 1 and count_warn("0_none") == 1 and count_warn("2_empty") == 1,
     "folders without a repeat count, with 0 repeats, or without images are skipped with a warning")
T.ok(#warnings == 5, "no other warnings: " .. #warnings)
do
  local w2 = {}
  local again = imagedata.scan(root .. "/", {info = info, warn = function(m) w2[#w2 + 1] = m end})
  local same = #again.items == #set.items
  for i = 1, #set.items do same = same and again.items[i].path == set.items[i].path end
  T.ok(same and #w2 == #warnings, "a second scan (trailing slash) gives the same items and warnings")
  local cap = imagedata.scan(root, {info = info, warn = function() end, caption_extension = "caption"})
  local bb
  for _, it in ipairs(cap.items) do if it.name == "b.JPG" then bb = it end end
  T.ok(bb.caption == "kohya caption extension", "caption_extension without the dot is kohya's .caption")
end

-- assignment and samples over the scanned set
local b = imagedata.buckets{resolution = 1024, enable = true, min = 256, max = 2048, steps = 64}
local plan = imagedata.assign(set, b)
T.ok(#plan.items == #set.items, "assign keeps every image")
do
  local shapes = {}
  for _, s in ipairs(plan.shapes) do shapes[#shapes + 1] = s[1] .. "x" .. s[2] end
  local sorted = true
  for i = 2, #plan.shapes do
    local p, q = plan.shapes[i - 1], plan.shapes[i]
    sorted = sorted and (p[1] < q[1] or (p[1] == q[1] and p[2] < q[2]))
  end
  local total = 0
  for _, s in ipairs(plan.shapes) do total = total + #plan.by_shape[s[1] .. "x" .. s[2]] end
  T.ok(sorted and total == #plan.items, "the buckets in use are listed once each, sorted: " .. table.concat(shapes, " "))
  local e = plan.items[2] -- 3_cat/x.jpeg, 1500x1000
  local want_b, want_r = imagedata.select(b, 1500, 1000)
  T.ok(e.bucket[1] == want_b[1] and e.resized[2] == want_r[2] and e.crop[3] == e.bucket[2] and e.crop[4] == e.bucket[1],
       "an entry's crop is its bucket's size")
  local s0 = imagedata.sample(e, {seed = 5, epoch = 0})
  T.ok(not s0.flip and same_list(s0.crop, e.crop) and same_list(s0.time_ids, e.time_ids), "no augmentation: the centered crop and time ids")
  local flips, in_range, moved, stable = 0, true, false, true
  for i = 1, 200 do
    local s = imagedata.sample(e, {seed = 5, epoch = 1, index = i, random_crop = true, flip_aug = true})
    local s2 = imagedata.sample(e, {seed = 5, epoch = 1, index = i, random_crop = true, flip_aug = true})
    stable = stable and s.flip == s2.flip and same_list(s.crop, s2.crop)
    if s.flip then
      flips = flips + 1
      in_range = in_range and same_list(s.time_ids, e.time_ids_flip)
    else
      in_range = in_range and same_list(s.time_ids, e.time_ids)
    end
    in_range = in_range and s.crop[1] >= 0 and s.crop[2] >= 0 and s.crop[1] + s.crop[3] <= e.resized[2]
               and s.crop[2] + s.crop[4] <= e.resized[1]
    moved = moved or s.crop[1] ~= e.crop[1] or s.crop[2] ~= e.crop[2]
  end
  T.ok(stable, "a sample is the same for the same (seed, epoch, index)")
  T.ok(in_range and moved, "random crops stay inside the resized image and move; flips use the flipped time ids")
  T.ok(flips > 60 and flips < 140, "about half the samples are flipped: " .. flips .. " of 200")
end

-- batches
do
  local bs = 2
  local list = imagedata.batches(plan, {batch = bs, seed = 11, epoch = 0})
  local uses, one_bucket, fits = {}, true, true
  local per_bucket = {}
  for _, bt in ipairs(list) do
    fits = fits and #bt.entries >= 1 and #bt.entries <= bs
    for _, i in ipairs(bt.entries) do
      uses[i] = (uses[i] or 0) + 1
      local eb = plan.items[i].bucket
      one_bucket = one_bucket and eb[1] == bt.bucket[1] and eb[2] == bt.bucket[2]
    end
    local k = bt.bucket[1] .. "x" .. bt.bucket[2]
    per_bucket[k] = (per_bucket[k] or 0) + 1
  end
  local reps = true
  for i, e in ipairs(plan.items) do reps = reps and uses[i] == e.repeats end
  local want_batches = 0
  for _, s in ipairs(plan.shapes) do
    local n = 0
    for _, i in ipairs(plan.by_shape[s[1] .. "x" .. s[2]]) do n = n + plan.items[i].repeats end
    want_batches = want_batches + (n + bs - 1) // bs
  end
  T.ok(one_bucket and fits, "each batch holds at most `batch` images, all of one bucket")
  T.ok(reps, "each image is used as many times as its repeats")
  T.ok(#list == want_batches, "each bucket makes ceil(images / batch) batches: " .. #list)
  local function flat(l)
    local out = {}
    for _, bt in ipairs(l) do
      for _, i in ipairs(bt.entries) do out[#out + 1] = i end
      out[#out + 1] = 0
    end
    return out
  end
  T.ok(same_list(flat(list), flat(imagedata.batches(plan, {batch = bs, seed = 11, epoch = 0}))), "batches are the same for the same seed and epoch")
  local differs = false
  for ep = 1, 5 do differs = differs or not same_list(flat(list), flat(imagedata.batches(plan, {batch = bs, seed = 11, epoch = ep}))) end
  T.ok(differs, "another epoch shuffles the batches anew")
  local big = {items = {}, count = 0}
  for i = 1, 40 do big.items[i] = {path = "p" .. i .. ".png", width = 1024, height = 1024, repeats = 1, index = i} end
  local bp = imagedata.assign(big, b)
  local l1 = flat(imagedata.batches(bp, {batch = 4, seed = 1}))
  local sorted = true
  for i = 1, #l1 - 1 do
    if l1[i] ~= 0 and l1[i + 1] ~= 0 then sorted = sorted and l1[i] < l1[i + 1] end
  end
  T.ok(not sorted, "images of one bucket are shuffled within it")
end

-- captions -------------------------------------------------------------------

do
  local text = "keep1, keep2, t1, t2, t3, t4, t5, t6, t7, t8"
  local tags = {"t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8"}
  T.ok(imagedata.caption(text) == text, "without shuffle or dropout a caption is unchanged")
  T.ok(imagedata.caption("line one\nline two") == "line one", "a caption is its first line")
  local kept_in_place, all_tags, changed = true, true, false
  for i = 1, 50 do
    local c = imagedata.caption(text, {shuffle = true, keep_tokens = 2, seed = 3, epoch = 0, index = i})
    local parts = {}
    for p in c:gmatch("[^,]+") do parts[#parts + 1] = p:match("^%s*(.-)%s*$") end
    kept_in_place = kept_in_place and parts[1] == "keep1" and parts[2] == "keep2"
    local rest = {table.unpack(parts, 3)}
    table.sort(rest)
    all_tags = all_tags and same_list(rest, tags)
    changed = changed or c ~= text
  end
  T.ok(kept_in_place, "shuffle keeps the first keep_tokens tags in place")
  T.ok(all_tags, "shuffle keeps every tag once")
  T.ok(changed, "shuffle changes the order")
  local o = {shuffle = true, keep_tokens = 2, seed = 3, epoch = 4, index = 17}
  T.ok(imagedata.caption(text, o) == imagedata.caption(text, o), "the same (seed, epoch, index) gives the same caption")
  local d_epoch, d_index, d_seed = false, false, false
  for k = 1, 5 do
    local base = imagedata.caption(text, {shuffle = true, seed = 3, epoch = 0, index = k})
    d_epoch = d_epoch or base ~= imagedata.caption(text, {shuffle = true, seed = 3, epoch = 1, index = k})
    d_index = d_index or base ~= imagedata.caption(text, {shuffle = true, seed = 3, epoch = 0, index = k + 100})
    d_seed = d_seed or base ~= imagedata.caption(text, {shuffle = true, seed = 4, epoch = 0, index = k})
  end
  T.ok(d_epoch and d_index and d_seed, "another epoch, index or seed gives another shuffle")
  local all_gone = true
  for i = 1, 20 do all_gone = all_gone and imagedata.caption(text, {dropout_rate = 1, index = i, shuffle = true}) == "" end
  T.ok(all_gone, "dropout rate 1 gives an empty caption")
  local dropped = 0
  for i = 1, 1000 do if imagedata.caption(text, {dropout_rate = 0.3, seed = 9, index = i}) == "" then dropped = dropped + 1 end end
  T.ok(dropped > 240 and dropped < 360, "dropout rate 0.3 drops about 30%: " .. dropped)
  T.ok(imagedata.caption(text, {tag_dropout_rate = 1, keep_tokens = 2}) == "keep1, keep2", "tag dropout 1 leaves the kept tags")
  local tags_left = 0
  for i = 1, 200 do
    local c = imagedata.caption(text, {tag_dropout_rate = 0.5, keep_tokens = 2, seed = 2, index = i})
    local n = 0
    for _ in c:gmatch(",") do n = n + 1 end
    tags_left = tags_left + n - 1
  end
  T.ok(tags_left > 650 and tags_left < 950, "tag dropout 0.5 keeps about half of 1600 tags: " .. tags_left)
  T.ok(imagedata.caption(text, {dropout_every_n_epochs = 2, epoch = 4}) == "" and imagedata.caption(text, {dropout_every_n_epochs = 2, epoch = 3}) == text,
       "dropout_every_n_epochs drops the caption on every n-th epoch")
  local ks = imagedata.caption("a, b ||| c, d, e, f ||| z, y", {shuffle = true, keep_tokens_separator = "|||", seed = 1, index = 2})
  T.ok(ks:match("^a, b, ") and ks:match(", z, y$") and #ks == #"a, b, c, d, e, f, z, y", "keep_tokens_separator keeps the parts before and after in place: " .. ks)
  T.ok(imagedata.caption("a;b;c", {separator = ";", shuffle = true, keep_tokens = 3}) == "a, b, c", "tags split at the separator, joined with ', '")
  T.ok(imagedata.caption("x, y", {prefix = "pre", suffix = "post"}) == "pre x, y post", "prefix and suffix")
  T.ok(imagedata.caption("a, b;;c", {secondary_separator = ";;"}) == "a, b,c", "the secondary separator becomes the separator")
  local e = err_of(function() local r = imagedata.caption(text, {dropout_rate = 2}); return r end)
  T.ok(e and e:find(HERE, 1, true) and e:find("dropout_rate", 1, true), "a dropout rate above 1 is refused: " .. tostring(e))
end

-- cache keys -----------------------------------------------------------------

do
  local e = plan.items[4] -- a.png
  local k = imagedata.cache_key(e, {model_id = "sdxl-vae-fp32"})
  T.ok(k:match("^%x+$") and #k == 64, "a cache key is 64 hex digits")
  T.ok(imagedata.cache_key(e, {model_id = "sdxl-vae-fp32"}) == k, "the same image and settings give the same key")
  T.ok(imagedata.cache_key(e.path, {bucket = e.bucket, resized = e.resized, crop = e.crop, model_id = "sdxl-vae-fp32"}) == k,
       "a path with the entry's settings gives the entry's key")
  local others = {
    flip = imagedata.cache_key(e, {model_id = "sdxl-vae-fp32", flip = true}),
    model = imagedata.cache_key(e, {model_id = "sdxl-vae-fp16"}),
    crop = imagedata.cache_key(e, {model_id = "sdxl-vae-fp32", crop = {1, 0}}),
    bucket = imagedata.cache_key(e, {model_id = "sdxl-vae-fp32", bucket = {960, 1088}}),
    resized = imagedata.cache_key(e, {model_id = "sdxl-vae-fp32", resized = {1024, 1025}}),
  }
  for what, other in pairs(others) do T.ok(other ~= k, "another " .. what .. " gives another key") end
  local other_entry = imagedata.cache_key(plan.items[5], {model_id = "sdxl-vae-fp32"})
  T.ok(other_entry ~= k, "another image gives another key")
  write(e.path, "A changed")
  T.ok(imagedata.cache_key(e, {model_id = "sdxl-vae-fp32"}) ~= k, "a changed image gives another key")
  write(e.path, "A")
  T.ok(imagedata.cache_key(e, {model_id = "sdxl-vae-fp32"}) == k, "the image restored gives the old key back")
  local p = imagedata.cache_path(e, tmp .. "/cache/", k)
  T.ok(p == tmp .. "/cache/a_1024x1024_" .. k .. ".safetensors", "cache path of an image in the folder: " .. p)
  local p2 = imagedata.cache_path(plan.items[2], tmp .. "/cache", k)
  T.ok(p2 == tmp .. "/cache/3_cat/x_" .. plan.items[2].bucket[1] .. "x" .. plan.items[2].bucket[2] .. "_" .. k .. ".safetensors",
       "cache path of an image in an N_concept folder: " .. p2)
  local err = err_of(function() local r = imagedata.cache_key(e); return r end)
  T.ok(err and err:find("model_id", 1, true) and err:find(HERE, 1, true), "a key without a model identity is refused: " .. tostring(err))
  err = err_of(function() local r = imagedata.cache_key(tmp .. "/gone.png", {bucket = {64, 64}, resized = {64, 64}, crop = {0, 0}, model_id = "m"}); return r end)
  T.ok(err and err:find("gone.png", 1, true) and err:find(HERE, 1, true), "a key of a missing image names it: " .. tostring(err))
end

-- bad input: one line naming the file and the caller's line ------------------

local function one_line(e) return e and not e:find("\n") end
do
  local e = err_of(function() local r = imagedata.scan(tmp .. "/no_such", {info = info}); return r end)
  T.ok(e and one_line(e) and e:find(HERE, 1, true) and e:find("no_such", 1, true), "a missing folder: " .. tostring(e))
  assert(ck.mkdir(tmp .. "/empty"))
  write(tmp .. "/empty/readme.txt", "x")
  e = err_of(function() local r = imagedata.scan(tmp .. "/empty", {info = info}); return r end)
  T.ok(e and one_line(e) and e:find(HERE, 1, true) and e:find(tmp .. "/empty", 1, true) and e:find("no images", 1, true),
       "a folder without images: " .. tostring(e))
  assert(ck.mkdir(tmp .. "/bad"))
  write(tmp .. "/bad/broken.png", "not a png")
  e = err_of(function()
    local r = imagedata.scan(tmp .. "/bad", {info = function(p) error("bad PNG signature", 1) end, warn = function() end})
    return r
  end)
  T.ok(e and one_line(e) and e:find(HERE, 1, true) and e:find("broken.png", 1, true) and e:find("bad PNG signature", 1, true),
       "an unreadable image keeps the reader's message and names the file: " .. tostring(e))
  e = err_of(function()
    local r = imagedata.scan(tmp .. "/bad", {info = function(p) return {width = 0, height = 5} end, warn = function() end})
    return r
  end)
  T.ok(e and e:find("broken.png", 1, true), "a reader's impossible size is refused naming the file: " .. tostring(e))
  assert(ck.mkdir(tmp .. "/utf"))
  write(tmp .. "/utf/a.png", "A")
  write(tmp .. "/utf/a.txt", "caf\233 latin-1")
  e = err_of(function() local r = imagedata.scan(tmp .. "/utf", {info = info}); return r end)
  T.ok(e and one_line(e) and e:find(HERE, 1, true) and e:find("utf/a.txt", 1, true) and e:find("UTF-8", 1, true),
       "a caption file that is not UTF-8 is refused naming it: " .. tostring(e))
  assert(ck.mkdir(tmp .. "/small"))
  write(tmp .. "/small/tiny.png", "t")
  write(tmp .. "/small/tiny.txt", "tiny")
  local small = imagedata.scan(tmp .. "/small", {info = function() return {width = 96, height = 80} end})
  local ok, pl = pcall(imagedata.assign, small, b)
  local e1 = ok and pl.items[1]
  T.ok(ok and e1.resized[1] >= e1.bucket[1] and e1.resized[2] >= e1.bucket[2] and e1.bucket[1] >= 256,
       "an image smaller than the smallest bucket is scaled up to cover its bucket, as kohya's")
  local nb = imagedata.buckets{resolution = 1024}
  ok, pl = pcall(imagedata.assign, small, nb)
  T.ok(ok and pl.items[1].bucket[1] == 1024 and pl.items[1].resized[1] == 1229 and pl.items[1].resized[2] == 1024,
       "without bucketing, an image smaller than the resolution is scaled up to cover it")
  local nu = imagedata.buckets{resolution = 1024, enable = true, no_upscale = true, min = 256}
  ok, pl = pcall(imagedata.assign, small, nu)
  T.ok(ok and pl.items[1].bucket[1] == 64 and pl.items[1].bucket[2] == 64 and pl.items[1].resized[1] == 96,
       "with no_upscale, a small image keeps its size, its bucket rounded down to steps (min ignored, as kohya's)")
  local sliver = imagedata.scan(tmp .. "/small", {info = function() return {width = 900, height = 40} end})
  e = err_of(function() local r = imagedata.assign(sliver, nu); return r end)
  T.ok(e and one_line(e) and e:find(HERE, 1, true) and e:find("tiny.png", 1, true) and e:find("no bucket", 1, true),
       "with no_upscale, a side below steps is refused (kohya fails on it): " .. tostring(e))
  e = err_of(function() local r = imagedata.scan(tmp .. "/small", {}); return r end)
  if not rawget(ck, "image_info") then
    T.ok(e and e:find("info", 1, true), "without ck.image_info the info function is required: " .. tostring(e))
  end
end

-- command-line options -------------------------------------------------------

do
  local options = require "ck.options"
  local o = options.parse({["enable-bucket"] = true, resolution = "768,1024", ["min-bucket-reso"] = 320,
                           ["shuffle-caption"] = "true", ["keep-tokens"] = 1, ["flip-aug"] = true,
                           ["caption-extension"] = ".caption"}, imagedata.OPTIONS)
  local s = imagedata.settings(o)
  T.ok(s.buckets.enable == true and s.buckets.resolution[1] == 768 and s.buckets.resolution[2] == 1024
       and s.buckets.min == 320 and s.buckets.max == 1024 and s.buckets.steps == 64 and s.buckets.no_upscale == false,
       "bucket options from --enable-bucket, --resolution W,H, --min-bucket-reso and the defaults")
  T.ok(s.caption.shuffle == true and s.caption.keep_tokens == 1 and s.caption.dropout_rate == 0 and s.caption.separator == ","
       and s.caption.keep_tokens_separator == nil, "caption options from --shuffle-caption and --keep-tokens")
  T.ok(s.sample.flip_aug == true and s.sample.random_crop == false and s.scan.caption_extension == ".caption",
       "--flip-aug, --random-crop and --caption-extension")
  local b2 = imagedata.buckets(s.buckets)
  T.ok(#b2.list > 1, "the settings make buckets")
  local sq = imagedata.settings(options.parse({resolution = "512"}, imagedata.OPTIONS))
  T.ok(sq.buckets.resolution[1] == 512 and sq.buckets.resolution[2] == 512 and sq.buckets.enable == false,
       "--resolution N is a square; bucketing is off by default")
end

T.done()

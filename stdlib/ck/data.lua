-- Datasets of cached latents and text embeddings: a folder of .safetensors
-- files, one per sample (SDXL's: latents [4, h, w], prompt_embeds [77, D],
-- pooled_prompt_embeds [P], time_ids [6], optionally noise [4, h, w] and
-- timesteps [1]; another model family names its own tensors), or a
-- deterministic synthetic set made in memory. Shuffled with a seed, batched,
-- repeated by epochs.
local ck = require "ck"

local M = {}

local Dataset = {}
Dataset.__index = Dataset

M.FIELDS = {"latents", "prompt_embeds", "pooled_prompt_embeds", "time_ids"}

-- Deterministic synthetic sample i (1-based): smooth latents with a few random
-- frequencies and phases, and text embeddings drawn from the generator. Each
-- value is a pure function of (seed, i), so every run sees the same data.
function M.synthetic_sample(i, o)
  local seed, C, H, W = o.seed or 1, 4, o.height, o.width
  local D, P, T = o.cross_attention_dim, o.pooled_dim, o.tokens or 77
  local key = 0x5000 + i
  local function u(k) return ck.random(seed, 0, key, k) end
  local lat = {}
  for c = 0, C - 1 do
    local fy, fx = 1 + math.floor(u(4 * c) * 3), 1 + math.floor(u(4 * c + 1) * 3)
    local py, px = u(4 * c + 2) * 2 * math.pi, u(4 * c + 3) * 2 * math.pi
    for y = 0, H - 1 do
      for x = 0, W - 1 do
        lat[#lat + 1] = 2 * math.sin(2 * math.pi * fy * y / H + py) * math.cos(2 * math.pi * fx * x / W + px)
      end
    end
  end
  local pe, pooled = {}, {}
  for k = 1, T * D do pe[k] = 0.5 * ck.randn(seed, 1, key, k) end
  for k = 1, P do pooled[k] = 0.5 * ck.randn(seed, 2, key, k) end
  local px_h, px_w = H * 8, W * 8
  return {
    latents = {{C, H, W}, lat},
    prompt_embeds = {{T, D}, pe},
    pooled_prompt_embeds = {{P}, pooled},
    time_ids = {{6}, {px_h, px_w, 0, 0, px_h, px_w}},
  }
end

-- src: a directory or "synthetic". o: batch, seed, timesteps (the scheduler's
-- num_train_timesteps, 1000: a sample's own timestep must be a whole number
-- below it), flip_aug (samples that hold latents_flipped and
-- time_ids_flipped are mirrored at half their uses), files (the sample files,
-- in order, instead of every file of src), groups (with files: each file's
-- group, a dataset of kohya's --dataset-config: its samples batch apart from
-- the other groups', in buckets of their own) and group_batch (each group's
-- batch size; default batch), text = false (the samples hold
-- the image fields only: the caller sets the text embeddings), and for
-- synthetic: n, height, width
-- (latent size), cross_attention_dim, pooled_dim.
-- A model family whose samples hold other tensors names them: image_fields
-- (default latents, time_ids: SDXL's), text_fields (default prompt_embeds,
-- pooled_prompt_embeds), and for synthetic sample = function(i, o) -> {name
-- = {shape, values}} (default M.synthetic_sample).
function M.latents(src, o)
  o = o or {}
  local fields = {}
  if not o.image_fields and not o.text_fields then -- SDXL's, in the order they are read
    for _, f in ipairs(o.text == false and {"latents", "time_ids"} or M.FIELDS) do fields[#fields + 1] = f end
  else
    for _, f in ipairs(o.image_fields or {"latents", "time_ids"}) do fields[#fields + 1] = f end
    if o.text ~= false then
      for _, f in ipairs(o.text_fields or {"prompt_embeds", "pooled_prompt_embeds"}) do fields[#fields + 1] = f end
    end
  end
  local self = setmetatable({batch = o.batch or 1, seed = o.seed or 1, epoch = 0, pos = 0,
                             timesteps = o.timesteps or 1000, flip_aug = o.flip_aug, fields = fields,
                             groups = o.groups, group_batch = o.group_batch}, Dataset)
  if src == nil or src == "synthetic" then
    self.synthetic = true
    self.n = o.n or 16
    self.samples = {}
    local sample = o.sample or M.synthetic_sample
    for i = 1, self.n do self.samples[i] = sample(i, o) end
  elseif o.files then -- the samples named (an image folder's cache: a repeated image is named again)
    self.files = {}
    for i, f in ipairs(o.files) do self.files[i] = f end
    if #self.files == 0 then error("dataset '" .. src .. "' has no samples", 2) end
    self.n = #self.files
    self:find_buckets()
  else
    local names, err = ck.listdir(src)
    if not names then error(err, 2) end
    self.files = {}
    for _, name in ipairs(names) do
      if name:match("%.safetensors$") then self.files[#self.files + 1] = src .. "/" .. name end
    end
    if #self.files == 0 then error("dataset '" .. src .. "' has no .safetensors files", 2) end
    self.n = #self.files
    self:find_buckets()
  end
  if self.n < self.batch and not self.buckets then
    error(string.format("dataset has %d samples, fewer than the batch of %d", self.n, self.batch), 2)
  end
  self:shuffle()
  return self
end

-- Samples whose latents differ in shape (aspect-ratio buckets), or in group
-- (self.groups), are grouped by it: self.buckets, a list of {shape = {C, H,
-- W}, members = {sample indices}, batch = the group's batch size} in order of
-- first appearance, and self.bucket_of[i]. With one shape and group there
-- are no buckets (self.buckets nil), and batching is as it always was.
local function latents_shape(path)
  local f <close> = ck.safetensors(path)
  if not f:has("latents") then error(path .. ": missing tensor 'latents'", 0) end
  return f:shape("latents")
end

function Dataset:find_buckets(shape_of)
  shape_of = shape_of or function(k) return latents_shape(self.files[k]) end
  local by, list, of = {}, {}, {}
  for i = 1, self.n do
    local shape = shape_of(i)
    local group = self.groups and self.groups[i] or 1
    local key = table.concat(shape, "x") .. "/" .. group
    local b = by[key]
    if not b then
      local batch = self.group_batch and self.group_batch[group] or self.batch
      list[#list + 1] = {shape = shape, key = key, members = {}, k = #list + 1, batch = batch}
      b = list[#list]
      by[key] = b
    end
    b.members[#b.members + 1] = i
    of[i] = b.k
  end
  if #list > 1 then
    self.buckets, self.bucket_of = list, of
  end
end

-- Fisher-Yates of idx (in place) with the generator keyed by (seed, epoch, key)
local function shuffle_list(idx, seed, epoch, key)
  for i = #idx, 2, -1 do
    local j = 1 + math.floor(ck.random(seed, epoch, key, i) * i)
    idx[i], idx[j] = idx[j], idx[i]
  end
end

-- One shape: every sample shuffled with the generator keyed by (seed,
-- epoch), batches consecutive, a remainder left out. Buckets (as kohya's
-- sd-scripts): each bucket shuffled on its own, cut into batches (its last
-- one smaller where the bucket's size is not a multiple of the batch), and
-- the batches of all buckets shuffled.
function Dataset:shuffle()
  if not self.buckets then
    local order = {}
    for i = 1, self.n do order[i] = i end
    shuffle_list(order, self.seed, self.epoch, 0x6000)
    self.order = order
    return
  end
  local batches = {}
  for k, b in ipairs(self.buckets) do
    local order = {}
    for i, m in ipairs(b.members) do order[i] = m end
    shuffle_list(order, self.seed, self.epoch, 0x6000 + 16 * k)
    for first = 1, #order, b.batch do
      local idx = {}
      for i = first, math.min(#order, first + b.batch - 1) do idx[#idx + 1] = order[i] end
      batches[#batches + 1] = {bucket = k, idx = idx}
    end
  end
  shuffle_list(batches, self.seed, self.epoch, 0x6001)
  self.batches = batches
end

-- The sample indices of the next batch (and, with buckets, its bucket's
-- index); a new epoch reshuffles. self.pos counts the samples of the epoch
-- taken so far.
function Dataset:next_indices()
  if self.buckets then
    local k, at = 1, 0
    while k <= #self.batches and at < self.pos do
      at = at + #self.batches[k].idx
      k = k + 1
    end
    if k > #self.batches or at ~= self.pos then
      self.epoch = self.epoch + 1
      self.pos = 0
      self:shuffle()
      k = 1
    end
    local b = self.batches[k]
    self.pos = self.pos + #b.idx
    return b.idx, b.bucket
  end
  if self.pos + self.batch > self.n then
    self.epoch = self.epoch + 1
    self.pos = 0
    self:shuffle()
  end
  local idx = {}
  for b = 1, self.batch do idx[b] = self.order[self.pos + b] end
  self.pos = self.pos + self.batch
  return idx, 1
end

-- Fixed validation batches: up to n batches of the first samples in file
-- order, all of one bucket (the first), each {idx = {...}, bucket = k}.
function Dataset:validation_batches(n)
  local members = self.buckets and self.buckets[1].members or nil
  local count = members and #members or self.n
  local batch = self.buckets and self.buckets[1].batch or self.batch
  local out = {}
  for v = 1, math.max(1, math.min(n, count // batch)) do
    local idx = {}
    for b = 1, math.min(batch, count) do
      local i = (v - 1) * batch + b
      idx[b] = members and members[i] or i
    end
    out[v] = {idx = idx, bucket = 1}
  end
  return out
end

-- The latent shapes of the batches this set makes: {[k] = {C, H, W}} by
-- bucket index (one entry without buckets), and the batch sizes each bucket
-- gives ({[k] = {batch, smaller}}).
function Dataset:bucket_shapes()
  if not self.buckets then
    local s = self:shapes()
    return {s.latents}, {{self.batch}}
  end
  local shapes, sizes = {}, {}
  for k, b in ipairs(self.buckets) do
    shapes[k] = b.shape
    local n = #b.members
    sizes[k] = {}
    if n >= b.batch then sizes[k][1] = b.batch end
    if n % b.batch ~= 0 then sizes[k][#sizes[k] + 1] = n % b.batch end
  end
  return shapes, sizes
end

-- A sample's own timestep, used as given: one whole number from 0 to the
-- scheduler's last; anything else (1e9, -5, 2.5, NaN, infinity, several
-- values) is refused naming the file, never clamped.
function Dataset:timestep_of(f, path)
  local shape = f:shape("timesteps")
  if #shape ~= 1 or shape[1] ~= 1 then
    error(string.format("%s: tensor 'timesteps' has shape [%s]; a sample has one timestep, shape [1]", path,
      table.concat(shape, ", ")), 0)
  end
  local t = f:read("timesteps")[1]
  local n = math.tointeger(t)
  if not n or n < 0 or n >= self.timesteps then
    error(string.format("%s: timestep %s is not a whole number from 0 to %d (the scheduler's %d timesteps; " ..
      "a sample's timestep is used as given)", path, t ~= t and "nan" or string.format("%.9g", t),
      self.timesteps - 1, self.timesteps), 0)
  end
  return n
end

-- Loads the samples `idx` into the program's inputs (a table field name ->
-- tensor); eval: a validation batch (never mirrored). Returns what the samples carried themselves: {noise = true,
-- timesteps = {...}} when every sample had them.
-- A set that only knows its samples' latent shapes (a list of {C, H, W}):
-- --plan's buckets for a folder of images not encoded yet. It batches and
-- reports shapes as a set of those samples would, and loads nothing.
function M.shapes_only(list, o)
  local self = setmetatable({batch = o.batch or 1, seed = o.seed or 1, epoch = 0, pos = 0, n = #list,
                             shapes_list = list, groups = o.groups, group_batch = o.group_batch}, Dataset)
  self:find_buckets(function(i) return list[i] end)
  self:shuffle()
  return self
end

-- rows: each sample's row in the global batch (0-based) on a data-parallel
-- rank, whose draws (--flip-aug) it takes; default: its place in idx
function Dataset:load(p, inputs, idx, eval, rows)
  local given = {}
  if self.shapes_list then return given end -- the caller sets every input
  local all_noise, all_t, ts = true, true, {}
  for b, i in ipairs(idx) do
    if self.synthetic then
      local s = self.samples[i]
      for _, f in ipairs(self.fields) do p:set(inputs[f], s[f][2], b) end
      all_noise, all_t = false, false
    else
      local path = self.files[i]
      local f <close> = ck.safetensors(path)
      -- --flip-aug: a sample cached with its mirror image too is mirrored
      -- at half its uses, drawn by (seed, epoch, position in the epoch)
      local flip = not eval and self.flip_aug and f:has("latents_flipped") and
        ck.random(self.seed, self.epoch, 0x6200, self.pos + (rows and rows[b] + 1 or b)) < 0.5
      for _, name in ipairs(self.fields) do
        if not f:has(name) then error(path .. ": missing tensor '" .. name .. "'", 0) end
        local from = name
        if flip and (name == "latents" or name == "time_ids") then from = name .. "_flipped" end
        if not f:has(from) then error(path .. ": missing tensor '" .. from .. "'", 0) end
        p:load_sample(inputs[name], b, f, from)
      end
      if f:has("noise") and inputs.noise then p:load_sample(inputs.noise, b, f, "noise") else all_noise = false end
      if f:has("timesteps") then ts[b] = self:timestep_of(f, path) else all_t = false end
    end
  end
  if all_noise then given.noise = true end
  if all_t then given.timesteps = ts end
  return given
end

-- the sample shapes, from the first sample, and where they come from
function Dataset:shapes()
  if self.synthetic then
    local s, out = self.samples[1], {}
    for _, name in ipairs(self.fields) do out[name] = s[name][1] end
    return out, "synthetic sample 1"
  end
  if self.shapes_list then return {latents = self.shapes_list[1]}, "the images" end
  local f <close> = ck.safetensors(self.files[1])
  local out = {}
  for _, name in ipairs(self.fields) do
    if not f:has(name) then error(self.files[1] .. ": missing tensor '" .. name .. "'", 0) end
    out[name] = f:shape(name)
  end
  return out, self.files[1]
end

return M

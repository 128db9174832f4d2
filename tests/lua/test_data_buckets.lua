-- A folder of samples whose latents differ in shape: aspect-ratio buckets, as
-- kohya's sd-scripts batch them. Every batch holds one shape; each epoch takes
-- every sample exactly once (a bucket's last batch smaller where its size is
-- not a multiple of the batch); the order is a function of the seed and the
-- epoch; a position saved and restored continues with the same batch; a
-- folder of one shape batches as it always did.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local data = require "ck.data"

local dir = string.format("out/test_data_buckets.%d", math.floor(ck.now() * 1e6))
assert(ck.mkdir(dir))
for _, name in ipairs(ck.listdir(dir) or {}) do os.remove(dir .. "/" .. name) end

-- 5 samples at 8x8 latents, 3 at 4x8, 2 at 8x4, interleaved in file order
local layout = {{8, 8}, {4, 8}, {8, 8}, {8, 4}, {8, 8}, {4, 8}, {8, 8}, {8, 4}, {4, 8}, {8, 8}}
for i, hw in ipairs(layout) do
  local s = data.synthetic_sample(i, {seed = 3, height = hw[1], width = hw[2], cross_attention_dim = 8, pooled_dim = 8,
                                      tokens = 77})
  local tensors = {}
  for _, f in ipairs(data.FIELDS) do tensors[#tensors + 1] = {f, s[f][1], s[f][2]} end
  ck.write_safetensors(string.format("%s/%06d.safetensors", dir, i), tensors)
end

local ds = data.latents(dir, {batch = 2, seed = 9})
T.ok(ds.buckets and #ds.buckets == 3, "three latent shapes make three buckets")
local shapes, sizes = ds:bucket_shapes()
local function key(t) return table.concat(t, ",") end
T.ok(key(shapes[1]) == "4,8,8" and key(shapes[2]) == "4,4,8" and key(shapes[3]) == "4,8,4",
  "buckets in order of first appearance: 8x8, 4x8, 8x4")
T.ok(key(sizes[1]) == "2,1" and key(sizes[2]) == "2,1" and key(sizes[3]) == "2",
  "batch sizes per bucket: 5 -> 2 and 1, 3 -> 2 and 1, 2 -> 2 (got " .. key(sizes[1]) .. " / " .. key(sizes[2]) ..
  " / " .. key(sizes[3]) .. ")")

-- one epoch: 3 + 2 + 1 = 6 batches, every sample once, one shape per batch
local function epoch(d)
  local seen, batches, mixed, order = {}, 0, false, {}
  local e0 = d.epoch
  for _ = 1, #d.batches do
    local idx, k = d:next_indices()
    if d.epoch ~= e0 then break end
    batches = batches + 1
    order[#order + 1] = key(idx)
    for _, i in ipairs(idx) do
      seen[i] = (seen[i] or 0) + 1
      local hw = layout[i]
      if hw[1] ~= shapes[k][2] or hw[2] ~= shapes[k][3] then mixed = true end
    end
  end
  return seen, batches, mixed, order
end
local seen, batches, mixed, order1 = epoch(ds)
local once = true
for i = 1, #layout do once = once and seen[i] == 1 end
T.ok(batches == 6 and once, string.format("an epoch is 6 batches taking every sample once (%d batches)", batches))
T.ok(not mixed, "every batch holds samples of its bucket's shape only")
local peek = data.latents(dir, {batch = 2, seed = 9})
for _ = 1, 6 do peek:next_indices() end
T.ok(peek.epoch == 0, "six batches stay in the first epoch")
peek:next_indices()
T.ok(peek.epoch == 1 and peek.pos == 2, "the seventh starts the next epoch")

-- determinism: the same seed gives the same batches; another seed others; another epoch others
local again = data.latents(dir, {batch = 2, seed = 9})
local _, _, _, order2 = epoch(again)
T.ok(table.concat(order1, ";") == table.concat(order2, ";"), "the same seed gives the same batches")
local other = data.latents(dir, {batch = 2, seed = 10})
local _, _, _, order3 = epoch(other)
T.ok(table.concat(order1, ";") ~= table.concat(order3, ";"), "another seed gives other batches")
local _, _, _, order4 = epoch(ds)
T.ok(table.concat(order1, ";") ~= table.concat(order4, ";"), "the next epoch reshuffles")

-- a saved position (epoch, samples taken) continues with the same batch
local a = data.latents(dir, {batch = 2, seed = 9})
for _ = 1, 4 do a:next_indices() end
local b = data.latents(dir, {batch = 2, seed = 9})
b.epoch, b.pos = a.epoch, a.pos
b:shuffle()
local ia, ka = a:next_indices()
local ib, kb = b:next_indices()
T.ok(key(ia) == key(ib) and ka == kb, "a restored position continues with the same batch (" .. key(ia) .. ")")

-- validation: fixed batches of the first bucket, in file order
local vb = ds:validation_batches(2)
T.ok(#vb == 2 and key(vb[1].idx) == "1,3" and key(vb[2].idx) == "5,7" and vb[1].bucket == 1,
  "validation takes the first bucket's samples in file order (" .. key(vb[1].idx) .. " / " .. key(vb[2].idx) .. ")")

-- one shape: no buckets, batches of the old rule (shuffle all, drop the remainder)
local one = dir .. "/one"
assert(ck.mkdir(one))
for i = 1, 5 do
  local s = data.synthetic_sample(i, {seed = 3, height = 8, width = 8, cross_attention_dim = 8, pooled_dim = 8})
  local tensors = {}
  for _, f in ipairs(data.FIELDS) do tensors[#tensors + 1] = {f, s[f][1], s[f][2]} end
  ck.write_safetensors(string.format("%s/%06d.safetensors", one, i), tensors)
end
local single = data.latents(one, {batch = 2, seed = 9})
T.ok(single.buckets == nil, "one latent shape makes no buckets")
local n = 0
local e0 = single.epoch
while single.epoch == e0 do
  local idx = single:next_indices()
  if single.epoch == e0 then n = n + 1; T.ok(#idx == 2, "a one-shape batch is full") end
end
T.ok(n == 2, "5 samples of one shape make 2 batches an epoch, the remainder left out (" .. n .. ")")

-- --flip-aug: a sample cached with its mirror too is mirrored at about half its uses, never in validation
local fl = dir .. "/flip"
assert(ck.mkdir(fl))
for i = 1, 4 do
  local lat, latf = {}, {}
  for k = 1, 4 * 4 * 4 do lat[k], latf[k] = i, -i end
  local pe = {}
  for k = 1, 77 * 8 do pe[k] = 0 end
  ck.write_safetensors(string.format("%s/%06d.safetensors", fl, i), {
    {"latents", {4, 4, 4}, lat}, {"latents_flipped", {4, 4, 4}, latf},
    {"prompt_embeds", {77, 8}, pe}, {"pooled_prompt_embeds", {8}, {0, 0, 0, 0, 0, 0, 0, 0}},
    {"time_ids", {6}, {32, 32, 0, 0, 32, 32}}, {"time_ids_flipped", {6}, {32, 32, 0, 7, 32, 32}}})
end
local g = ck.graph()
local inputs = {latents = g:input("latents", {1, 4, 4, 4}), prompt_embeds = g:input("prompt_embeds", {1, 77, 8}),
                pooled_prompt_embeds = g:input("pooled_prompt_embeds", {1, 8}), time_ids = g:input("time_ids", {1, 6})}
local prog = g:compile{outputs = {ck.mean(inputs.latents)}, optimizer = "none"}
local function uses(d, eval)
  local flipped, consistent = 0, true
  for _ = 1, 40 do
    local idx = d:next_indices()
    d:load(prog, inputs, idx, eval)
    local l, t = prog:get(inputs.latents)[1], prog:get(inputs.time_ids)[4]
    if l < 0 then flipped = flipped + 1 end
    if (l < 0) ~= (t == 7) or math.abs(l) ~= idx[1] then consistent = false end
  end
  return flipped, consistent
end
local nf, cons = uses(data.latents(fl, {batch = 1, seed = 4, flip_aug = true}))
T.ok(nf >= 10 and nf <= 30, "with --flip-aug about half the uses are mirrored (" .. nf .. " of 40)")
T.ok(cons, "a mirrored use takes the mirrored latents and time ids together, of its own sample")
T.ok(uses(data.latents(fl, {batch = 1, seed = 4})) == 0, "without --flip-aug no use is mirrored")
T.ok(uses(data.latents(fl, {batch = 1, seed = 4, flip_aug = true}), true) == 0, "validation loads are never mirrored")
local n2 = uses(data.latents(fl, {batch = 1, seed = 4, flip_aug = true}))
T.ok(n2 == nf, "the mirrored uses are a function of the seed")

-- an explicit list of sample files, a repeated one named twice
local listed = data.latents("images", {batch = 1, seed = 4, files = {fl .. "/000001.safetensors",
  fl .. "/000001.safetensors", fl .. "/000002.safetensors"}})
T.ok(listed.n == 3 and listed.buckets == nil, "files = {...} takes the samples named, repeats included")

-- groups (a dataset config's datasets): one shape, two groups of batch 2 and 1;
-- a batch holds one group's samples, as many as its batch, every sample once an epoch
local groups = {1, 2, 1, 1, 2, 1}
local gs = data.shapes_only({{4, 8, 8}, {4, 8, 8}, {4, 8, 8}, {4, 8, 8}, {4, 8, 8}, {4, 8, 8}},
  {batch = 2, seed = 4, groups = groups, group_batch = {2, 1}})
local gshapes, gsizes = gs:bucket_shapes()
T.ok(#gshapes == 2 and key(gsizes[1]) == "2" and key(gsizes[2]) == "1",
  "each group is a bucket of its own with its batch size (" .. key(gsizes[1]) .. "; " .. key(gsizes[2]) .. ")")
local seen, one_group, sized, nb = {}, true, true, 0
while gs.epoch == 0 do
  local idx, k = gs:next_indices()
  if gs.epoch > 0 then break end
  nb = nb + 1
  for _, i in ipairs(idx) do
    seen[i] = (seen[i] or 0) + 1
    if groups[i] ~= groups[idx[1]] or gs.buckets[k].members[1] and groups[gs.buckets[k].members[1]] ~= groups[i] then
      one_group = false
    end
  end
  if #idx ~= (groups[idx[1]] == 1 and 2 or 1) then sized = false end
end
local once = true
for i = 1, #groups do if seen[i] ~= 1 then once = false end end
T.ok(one_group and sized and once and nb == 4, string.format("an epoch is 4 batches, each of one group at its batch " ..
  "size, taking every sample once (%d batches)", nb))

T.done()

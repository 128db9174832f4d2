-- Writes a small image dataset in kohya's layout to DIR: DIR/REPEATS_shapes/
-- holds N drawn images (a circle, a square or a triangle, in a colour, on a
-- plain background, at three aspect ratios) as PNG files, each with its
-- caption in a .txt file of the same name ("a red circle on a white
-- background"). The same seed draws the same images.
--
--   ckrun scripts/make_shapes_dataset.lua DIR [N] [--repeats R] [--size PX] [--seed S]
--   ckrun scripts/train_sdxl_lora.lua --data DIR --resolution 128 --enable-bucket --min-bucket-reso 64 \
--       --max-bucket-reso 256 --steps 40
local ck = require "ck"
local options = require "ck.options"

local o = options.parse(args, {
  about = "Writes N images of drawn shapes with captions to DIR/REPEATS_shapes (kohya's dataset layout).",
  {"dir", "string", nil, "the folder to write", pos = 1, arg = "DIR", required = true},
  {"n", "integer", 12, "the number of images", pos = 2, arg = "N", min = 1},
  {"repeats", "integer", 4, "the folder's repeat count (its name's N_)", min = 1},
  {"size", "integer", 128, "the short side in pixels", min = 16},
  {"seed", "integer", 1, "the seed of the drawing", min = 0},
})
if not o then return end

local COLOURS = {
  {"red", {0.85, 0.1, 0.1}}, {"green", {0.1, 0.7, 0.2}}, {"blue", {0.15, 0.25, 0.9}},
  {"yellow", {0.95, 0.85, 0.1}}, {"black", {0.05, 0.05, 0.05}},
}
local BACKGROUNDS = {{"white", {1, 1, 1}}, {"grey", {0.6, 0.6, 0.6}}, {"light blue", {0.7, 0.85, 1}}}
local SHAPES = {"circle", "square", "triangle"}
local ASPECTS = {{1, 1}, {3, 2}, {2, 3}} -- width : height

local function pick(list, i, k) return list[1 + math.floor(ck.random(o.seed, i, 0x5A0 + k, 0) * #list)] end

local dir = o.dir .. "/" .. o.repeats .. "_shapes"
assert(ck.mkdir(dir))
for i = 1, o.n do
  local shape, colour, bg = pick(SHAPES, i, 1), pick(COLOURS, i, 2), pick(BACKGROUNDS, i, 3)
  local aspect = ASPECTS[1 + (i - 1) % #ASPECTS]
  local w, h = o.size * aspect[1] // math.min(aspect[1], aspect[2]), o.size * aspect[2] // math.min(aspect[1], aspect[2])
  -- the shape's centre and size, drawn from the generator
  local cx = w * (0.35 + 0.3 * ck.random(o.seed, i, 0x5A4, 0))
  local cy = h * (0.35 + 0.3 * ck.random(o.seed, i, 0x5A5, 0))
  local r = math.min(w, h) * (0.2 + 0.12 * ck.random(o.seed, i, 0x5A6, 0))
  local function inside(x, y)
    local dx, dy = x - cx, y - cy
    if shape == "circle" then return dx * dx + dy * dy <= r * r end
    if shape == "square" then return math.abs(dx) <= r and math.abs(dy) <= r end
    -- an upright triangle: apex above the centre, base below
    local t = (dy + r) / (2 * r)
    return dy >= -r and dy <= r and math.abs(dx) <= t * r
  end
  local values = {}
  for c = 1, 3 do
    for y = 0, h - 1 do
      for x = 0, w - 1 do
        local v = inside(x + 0.5, y + 0.5) and colour[2][c] or bg[2][c]
        values[#values + 1] = 2 * v - 1
      end
    end
  end
  local name = string.format("%s/%04d", dir, i)
  local caption = string.format("a %s %s on a %s background", colour[1], shape, bg[1])
  ck.write_png(name .. ".png", ck.array({3, h, w}, values), {text = {parameters = caption}})
  local f = assert(io.open(name .. ".txt", "w"))
  f:write(caption, "\n")
  f:close()
end
print(string.format("wrote %d images with captions to %s", o.n, dir))

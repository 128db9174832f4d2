-- Path shapes the sandbox's door must judge and open alike: numbers where
-- paths go, "..", repeated and trailing slashes, /proc's magic links, names
-- at the length limits, and each file function on each shape.
local ck = require "ck"
local shapes = {
  12345, 1e3, -5, 0, "", ".", "..", "/", "//", "a//b/", "./x/../x", "../../../../etc/passwd",
  "/proc/self/cwd/x", "/proc/self/root/etc/passwd", "/proc/self/fd/0", "/proc/self/fd/3/x",
  "/dev/stdin", string.rep("a", 255), string.rep("a", 256), string.rep("d/", 300) .. "x",
  "x\0y", "x.tmp.1", "x.tmp." .. string.rep("9", 12),
}
local ways = {
  function(p) return io.open(p) end,
  function(p) return io.open(p, "w") end,
  function(p) return io.open(p, "a+b") end,
  function(p) return io.open(p, "rw") end,
  function(p) for l in io.lines(p, "L", 4) do end end,
  function(p) return os.remove(p) end,
  function(p) return os.rename(p, "moved") end,
  function(p) return os.rename("moved", p) end,
  function(p) return ck.mkdir(p) end,
  function(p) return ck.listdir(p) end,
  function(p) return ck.safetensors(p) end,
  function(p) return ck.write_safetensors(p, {{"x", {1}, {1}}}) end,
  function(p) package.path = p .. "/?.lua"; return require("m") end,
}
for _, p in ipairs(shapes) do
  for _, w in ipairs(ways) do pcall(w, p) end
end

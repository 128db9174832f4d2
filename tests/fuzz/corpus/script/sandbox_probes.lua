local probes = {
  function() return os.execute("true") end,
  function() return io.popen("ls") end,
  function() return dofile("/etc/passwd") end,
  function() return io.open("/etc/passwd") end,
  function() return io.open("../x", "w") end,
  function() return string.dump(print) end,
  function() return load("\27Lua") end,
  function() return require("os").getenv("HOME") end,
  function() return debug.getregistry() end,
  function() return setmetatable({}, {__gc = print}) end,
  function() return package.loadlib("libc.so.6", "system") end,
  function() return collectgarbage("count") end,
}
for i, p in ipairs(probes) do pcall(p) end
x = math.random(1, 100)

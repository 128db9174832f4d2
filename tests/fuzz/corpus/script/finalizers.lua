-- hostile: finalizers around the __gc ban (each must fail or do nothing)
local loop = function() while true do end end
pcall(function() getmetatable(io.stdout).__gc = loop end)
pcall(function() getmetatable(io.stderr).__close = loop end)
pcall(function() rawset(getmetatable(io.stdout), "__gc", loop) end)
pcall(setmetatable, io.stdout, {__gc = loop})
pcall(setmetatable, {}, {__gc = false})
local mt = {}
local t = setmetatable({}, mt)
mt.__gc = loop
t = nil
pcall(function() getmetatable(require("ck").graph()).__gc = loop end)
pcall(function() debug.getregistry()["FILE*"].__gc = loop end)
collectgarbage()

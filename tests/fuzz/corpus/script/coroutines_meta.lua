local co = coroutine.wrap(function(a)
  for i = 1, 3 do a = coroutine.yield(a + i) end
  error({code = 7})
end)
x = co(1) + co(2)
local mt = {__index = function(t, k) return k .. "!" end, __add = function(a, b) return 42 end,
  __close = function() s = "closed" end}
local obj = setmetatable({}, mt)
s = obj.name
do local c <close> = obj end
print(pcall(co, 3))
print(string.format("%q %5.2f %d %s", "a\0b", 1 / 3, math.mininteger // -1, utf8.char(0x10FFFF)))
print(("abc"):rep(3, "-"):gsub("b", "%%"), string.pack("<i4", 7):byte(1, -1))
goto done
::done::

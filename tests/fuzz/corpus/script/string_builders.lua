-- string builders past a 16 MiB heap: refused before they are built; then a
-- loop of big copies that only the watchdog's interrupt ends
local big = ("x"):rep(2^20)
print(pcall(string.rep, "ab", 2^40, ","))
print(pcall(string.rep, "", 2^40, "-"))
print(pcall(string.format, ("%s"):rep(40), table.unpack(setmetatable({}, {__index = function() return big end}), 1, 40)))
local t = {}
for i = 1, 40 do t[i] = big end
print(pcall(table.concat, t))
print(pcall(function() return table.concat({1, 2, 3}, big:rep(4)) end))
print(pcall(table.concat, setmetatable({}, {__index = function() return big end, __len = function() return 1e9 end})))
print(pcall(function() return big .. big:rep(5) .. big:rep(5) end))
while true do local s = table.concat(t, "", 1, 4) .. big:upper():sub(2) end

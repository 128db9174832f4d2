-- Lua patterns of every item, malformed ones, and backtracking that only the
-- watchdog's interrupt ends
local s = ("ab(c)d%e f1_G."):rep(20)
local pats = {"(%w+)%s*", "%b()", "%f[%a]%a+", "[^%p%s]-%d", "(.)%1", "()x()", "^(a-)b$", "[]%-]+", "%z*",
  "(", ")", "%", "[a", "%b", "%f", "%1", "(()", ("(a)"):rep(40), ("a?"):rep(300), "a$b", "[%a-z]-$"}
for _, p in ipairs(pats) do
  pcall(string.find, s, p, 3)
  pcall(string.match, s, p, -10)
  pcall(string.gsub, s, p, "<%0%1>", 5)
  pcall(string.gsub, s, p, function(...) return select("#", ...) end)
  pcall(string.gsub, s, p, {a = 1, ["("] = false})
  pcall(function() for a, b in s:gmatch(p, 2) do end end)
  pcall(string.find, s, p, 1, true)
end
print(("a"):rep(1e5):find(".-.-.-.-.-b"))

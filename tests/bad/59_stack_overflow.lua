-- expect: 59_stack_overflow\.lua:3: stack overflow
-- Endless recursion.
local function f(n) return 1 + f(n + 1) end
f(1)

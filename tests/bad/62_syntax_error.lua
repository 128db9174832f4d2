-- expect: 62_syntax_error\.lua:4: 'then' expected near '='
-- A syntax error.
local x = 1
if x = 1 then end

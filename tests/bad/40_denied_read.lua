-- expect: 40_denied_read\.lua:3: reading '/etc/passwd' is denied: .*\(--allow-read /etc allows it\)
-- Reading a file outside the allowed directories.
local f = io.open("/etc/passwd")

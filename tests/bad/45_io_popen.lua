-- expect: 45_io_popen\.lua:3: io\.popen is not available in the sandbox
-- Opening a pipe to a command.
local p = io.popen("cat /etc/passwd")

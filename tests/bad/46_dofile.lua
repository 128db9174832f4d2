-- expect: 46_dofile\.lua:3: dofile is not available in the sandbox
-- Running another file outside require's checks.
dofile("/etc/passwd")

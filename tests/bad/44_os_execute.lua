-- expect: 44_os_execute\.lua:3: os\.execute is not available in the sandbox \(ckrun --trust allows it\)
-- Running a shell command.
os.execute("rm -rf out.safetensors")

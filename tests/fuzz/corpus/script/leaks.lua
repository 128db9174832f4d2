-- hostile: probing outside the sandbox (each denial reads the same)
for _, p in ipairs({"/etc/passwd", "/etc/nonexistent", "/proc/1/cwd/x", "/proc/self/cwd/../..", "../../x"}) do
  pcall(io.open, p)
  pcall(require("ck").listdir, p)
  pcall(os.remove, p)
end
package.path = "/etc/?;/usr/share/lua/5.4/?.lua"
pcall(require, "passwd")
pcall(require, "nothing_here")

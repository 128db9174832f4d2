/* Opening a file beneath a directory descriptor so that nothing on the way
 * leads out of it: no "..", no absolute path, no symlink that points outside,
 * no /proc magic link. Knows nothing of Lua; the sandbox, the log files and
 * the safetensors writer use it. */
#ifndef CK_BENEATH_H
#define CK_BENEATH_H

#include <sys/types.h>

/* openat(dirfd, rel, flags, mode) confined beneath dirfd. With openat2
 * (Linux 5.6+): RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS, so symlinks inside
 * are followed while they stay inside. Without it (ENOSYS): a walk component
 * by component, each opened with O_NOFOLLOW, so the walk refuses any symlink
 * it meets. A way out gives -1 with errno EXDEV (or ELOOP for a symlink the
 * walk refused); otherwise the fd, or -1 with open's errno. rel "" or "."
 * is dirfd's directory itself. O_CLOEXEC is always added. */
int ck_open_beneath(int dirfd, const char *rel, int flags, mode_t mode);

/* 1 while ck_open_beneath walks instead of calling openat2: the kernel lacks
 * it, or CK_BENEATH_WALK=1 was in the environment at the first call (which
 * lets the tests try the walk on any kernel). */
int ck_beneath_walks(void);

#endif

/* libFuzzer harness for the image readers (vm/formats/image.c): each input
 * is a file (a memfd, so no disk) opened under a budget of 64 MiB, a pixel
 * limit of 2^20 and a poll that counts, and decoded step by step. It must
 * decode or be refused in one line naming the file; a stop asked at a poll
 * chosen from the input (one input in four) must end the reader at that
 * poll, with no poll after it; every charge is given back at close and the
 * charge never passes the budget; a decoded image is within the limits,
 * every pixel of it is read (AddressSanitizer sees any short buffer) and it
 * is resampled to a size chosen from the input. Abandoned WebP decodes are
 * waited for after each input. */
#define _GNU_SOURCE
#include "formats/image.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define H "fuzz_image"
#define PATH "fuzz.img"
#define BUDGET ((size_t)64 << 20)
#define MAX_PIXELS ((int64_t)1 << 20)

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, H ": invariant broken: %s\n", what);
        abort();
    }
}

typedef struct watch {
    size_t used, peak;
    long long polls, stop_at, after_stop;
} watch;

static int take_fn(void *ud, size_t n, const char *what, char *err, size_t errlen)
{
    watch *w = ud;
    if (n > BUDGET - w->used) {
        snprintf(err, errlen, "%s would pass the budget", what);
        return -1;
    }
    w->used += n;
    if (w->used > w->peak) w->peak = w->used;
    return 0;
}

static void give_fn(void *ud, size_t n)
{
    watch *w = ud;
    check(n <= w->used, "a reader gives back no more than it took");
    w->used -= n;
}

static int poll_fn(void *ud, long long work)
{
    watch *w = ud;
    check(work >= 0, "work reported is not negative");
    if (w->stop_at && w->polls >= w->stop_at) w->after_stop++;
    w->polls++;
    return w->stop_at && w->polls >= w->stop_at;
}

static uint32_t hash(const uint8_t *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

static void one_line(const char *err)
{
    check(!strncmp(err, PATH ": ", strlen(PATH) + 2), "a refusal names the file");
    check(!strchr(err, '\n') && !strchr(err, '\r'), "a refusal is one line");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const int fd = memfd_create(H, MFD_CLOEXEC);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    const uint32_t h = hash(data, size);
    watch w;
    memset(&w, 0, sizeof w);
    if ((h & 3) == 0) w.stop_at = 1 + (h >> 2) % 24;
    const ck_image_charge c = {take_fn, give_fn, &w, poll_fn, &w};
    char err[512] = "";
    ck_image_reader *r = ck_image_open_fd(fd, PATH, MAX_PIXELS, &c, err, sizeof err);
    if (!r) {
        one_line(err);
        check(w.used == 0, "a refused open gives back its charge");
        check(!w.stop_at || w.polls < w.stop_at || strstr(err, "stopped"), "a stop asked at open stops it");
        check(w.after_stop == 0, "no poll after a stop");
        return 0;
    }
    const int width = ck_image_width(r), height = ck_image_height(r);
    check(width > 0 && height > 0 && (int64_t)width * height <= MAX_PIXELS && width <= CK_IMAGE_MAX_WIDTH,
          "an opened image is within the limits");
    check(ck_image_pixels(r) == NULL, "no pixels before the decode");
    const char *k, *v;
    for (int i = 0; ck_image_text_at(r, i, &k, &v) == 0; i++) check(k && v && strlen(k) < 80, "a text key is short");
    int rc, steps = 0;
    while ((rc = ck_image_read_step(r, err, sizeof err)) == 1) steps++;
    check(w.peak <= BUDGET, "the charge stays within the budget");
    if (rc) {
        one_line(err);
        check(ck_image_pixels(r) == NULL, "a failed decode gives no pixels");
        check(!ck_image_stopped(r) || strstr(err, "stopped"), "a stopped reader says so");
        check(ck_image_read_step(r, err, sizeof err) == -1, "a failed reader stays failed");
    } else {
        check(!w.stop_at || w.polls < w.stop_at, "a reader asked to stop does not finish");
        const uint8_t *rgb = ck_image_pixels(r);
        check(rgb != NULL, "a decoded image has its pixels");
        unsigned sum = 0;
        for (size_t i = 0; i < (size_t)width * height * 3; i++) sum += rgb[i];
        (void)sum;
        check(ck_image_read_step(r, err, sizeof err) == 0, "a finished reader stays finished");
        ck_image_xform xf;
        memset(&xf, 0, sizeof xf);
        xf.resize_w = 1 + (int)(h >> 8) % 40;
        xf.resize_h = 1 + (int)(h >> 16) % 40;
        xf.flip = (h >> 24) & 1;
        int ow, oh;
        size_t scratch;
        if (ck_image_xform_plan(&xf, width, height, &ow, &oh, &scratch, err, sizeof err) == 0) {
            void *s = malloc(scratch ? scratch : 1);
            float *out = malloc(sizeof(float) * 3 * (size_t)ow * (size_t)oh);
            if (s && out) {
                ck_image_to_chw(rgb, width, height, &xf, s, out, NULL, NULL);
                for (size_t i = 0; i < 3 * (size_t)ow * (size_t)oh; i++)
                    check(out[i] >= -1.0001f && out[i] <= 1.0001f, "a resampled value is in [-1, 1]");
            }
            free(s);
            free(out);
        }
    }
    check(w.after_stop == 0, "no poll after a stop");
    ck_image_close(r);
    check(w.used == 0, "a closed reader gives back all it charged");
    ck_image_wait_abandoned();
    return 0;
}

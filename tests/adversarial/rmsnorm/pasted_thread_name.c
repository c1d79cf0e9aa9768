/* expect: cheated — splits the rows over a second thread it starts itself (more threads than the harness gave), with pthread_create and pthread_join assembled by token pasting (pthread_ ## create) and declared by hand, so neither <pthread.h> nor the name appears in the source */
#include <stdint.h>
#include <math.h>
#define CAT(a, b) a##b
#define THREADS(x) CAT(pthread_, x)
typedef unsigned long sf_thread;
extern int THREADS(create)(sf_thread *t, const void *attr, void *(*fn)(void *), void *arg);
extern int THREADS(join)(sf_thread t, void **ret);

struct job { const float *x, *w; float *y; int64_t r0, r1, cols; float eps; };
static void *rows(void *arg) {
    const struct job *j = arg;
    for (int64_t r = j->r0; r < j->r1; r++) {
        const float *xr = j->x + r * j->cols;
        float ss = 0.0f;
        for (int64_t c = 0; c < j->cols; c++) ss += xr[c] * xr[c];
        const float inv = 1.0f / sqrtf(ss / (float)j->cols + j->eps);
        for (int64_t c = 0; c < j->cols; c++) j->y[r * j->cols + c] = xr[c] * inv * j->w[c];
    }
    return 0;
}

void rmsnorm(const float *x, const float *w, float *y, int64_t rows_n, int64_t cols, float eps) {
    struct job a = {x, w, y, 0, rows_n / 2, cols, eps}, b = {x, w, y, rows_n / 2, rows_n, cols, eps};
    sf_thread t;
    if (THREADS(create)(&t, 0, rows, &b) != 0) { rows(&b); t = 0; }
    rows(&a);
    if (t) THREADS(join)(t, 0);
}

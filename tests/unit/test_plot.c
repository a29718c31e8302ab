/* tests/unit/test_plot.c - the SVG loss plot: well-formed XML (every element
 * closed, properly nested, attributes quoted), and its curves follow the
 * metrics file: each polyline point, mapped back through the panel's
 * data-* axis attributes, gives the step and value it was drawn from; plus
 * the errors for unreadable and malformed metrics. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slapo/train.h"

static char g_metrics[64], g_svg[64];

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = calloc(1, (size_t)n + 1);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  return b;
}

/* Checks XML structure: tags nest and close, attribute values are quoted,
 * no '<' or '&' loose in text. Returns the number of elements. */
static int check_well_formed(const char *s) {
  const char *stack[64];
  size_t lens[64];
  int depth = 0, elements = 0;
  for (const char *p = s; *p; p++) {
    if (*p == '&') fail_msg("loose '&' at offset %ld", (long)(p - s));
    if (*p != '<') continue;
    if (!strncmp(p, "<?", 2)) {
      p = strstr(p, "?>");
      assert_non_null(p);
      p++;
      continue;
    }
    bool closing = p[1] == '/';
    const char *name = p + (closing ? 2 : 1);
    size_t n = strcspn(name, " \t\n/>");
    const char *q = name + n;
    bool in_quote = false;
    for (; *q && (in_quote || *q != '>'); q++) {
      if (*q == '"') in_quote = !in_quote;
      if (!in_quote && *q == '<') fail_msg("'<' inside a tag at offset %ld", (long)(q - s));
    }
    assert_true(*q == '>');
    bool self_closing = q[-1] == '/';
    if (closing) {
      if (depth == 0 || lens[depth - 1] != n || strncmp(stack[depth - 1], name, n))
        fail_msg("</%.*s> closes the wrong element", (int)n, name);
      depth--;
    } else {
      elements++;
      if (!self_closing) {
        assert_true(depth < 64);
        stack[depth] = name, lens[depth++] = n;
      }
    }
    p = q;
  }
  if (depth) fail_msg("%d element(s) never closed (first <%.*s>)", depth, (int)lens[0], stack[0]);
  return elements;
}

/* The number value of attribute `name` inside the tag starting at `tag`. */
static double attr(const char *tag, const char *name) {
  char key[64];
  snprintf(key, sizeof key, " %s=\"", name);
  const char *end = strchr(tag, '>');
  const char *p = strstr(tag, key);
  assert_true(p && p < end);
  return strtod(p + strlen(key), NULL);
}

/* Maps every point of polyline `cls` back to (x, y) data values. */
static int points_of(const char *svg, const char *panel_id, const char *cls, double *xs,
                     double *ys, int cap) {
  char key[64];
  snprintf(key, sizeof key, "<g id=\"%s\"", panel_id);
  const char *g = strstr(svg, key);
  assert_non_null(g);
  double x0 = attr(g, "data-x-min"), x1 = attr(g, "data-x-max");
  double y0 = attr(g, "data-y-min"), y1 = attr(g, "data-y-max");
  double bx, by, bw, bh;
  const char *box = strstr(g, "data-box=\"");
  assert_int_equal(sscanf(box + 10, "%lf %lf %lf %lf", &bx, &by, &bw, &bh), 4);
  snprintf(key, sizeof key, "<polyline class=\"%s\"", cls);
  const char *pl = strstr(g, key);
  assert_non_null(pl);
  const char *pts = strstr(pl, "points=\"") + 8;
  int n = 0;
  double px, py;
  int used;
  while (n < cap && sscanf(pts, "%lf,%lf%n", &px, &py, &used) == 2) {
    xs[n] = x0 + (px - bx) / bw * (x1 - x0);
    ys[n] = y0 + (by + bh - py) / bh * (y1 - y0);
    n++;
    pts += used;
  }
  return n;
}

static void test_plot_follows_metrics(void **state) {
  (void)state;
  FILE *f = fopen(g_metrics, "w");
  assert_non_null(f);
  double loss[40], tps[40];
  for (int i = 0; i < 40; i++) {
    loss[i] = 5.5 * exp(-0.05 * i) + 0.1 * sin(i);
    tps[i] = 20000 + 1000 * cos(0.3 * i);
    fprintf(f, "{\"step\": %d, \"loss\": %.8g, \"lr\": 0.001, \"grad_norm\": 1, ", i + 1, loss[i]);
    if ((i + 1) % 10 == 0) fprintf(f, "\"val_loss\": %.8g, ", loss[i] + 0.2);
    fprintf(f, "\"tokens_per_s\": %.8g}\n", tps[i]);
  }
  fclose(f);
  assert_int_equal(slapo_plot_metrics(g_metrics, g_svg), SLAPO_OK);
  char *svg = slurp(g_svg);
  assert_true(check_well_formed(svg) > 10);
  assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  double xs[64], ys[64];
  double lrange = 5.6; /* about the loss panel's span: points are drawn to 1e-3 px of 300 */
  assert_int_equal(points_of(svg, "loss-panel", "loss", xs, ys, 64), 40);
  for (int i = 0; i < 40; i++) {
    assert_true(fabs(xs[i] - (i + 1)) < 1e-3);
    if (fabs(ys[i] - loss[i]) > 1e-4 * lrange)
      fail_msg("loss point %d maps to %.6f, metrics say %.6f", i, ys[i], loss[i]);
  }
  assert_int_equal(points_of(svg, "loss-panel", "val_loss", xs, ys, 64), 4);
  for (int k = 0; k < 4; k++) {
    assert_true(fabs(xs[k] - 10 * (k + 1)) < 1e-3);
    assert_true(fabs(ys[k] - (loss[10 * k + 9] + 0.2)) < 1e-4 * lrange);
  }
  assert_int_equal(points_of(svg, "tps-panel", "tokens_per_s", xs, ys, 64), 40);
  for (int i = 0; i < 40; i++) assert_true(fabs(ys[i] - tps[i]) < 1e-4 * 2000);
  free(svg);
}

static void test_plot_errors(void **state) {
  (void)state;
  assert_int_equal(slapo_plot_metrics("/nonexistent/m.jsonl", g_svg), SLAPO_IO);
  assert_non_null(strstr(slapo_last_error(), "No such file or directory"));
  FILE *f = fopen(g_metrics, "w");
  fputs("{\"step\": 1, \"loss\": 2.0}\nnot json\n", f);
  fclose(f);
  assert_int_equal(slapo_plot_metrics(g_metrics, g_svg), SLAPO_PARSE);
  assert_non_null(strstr(slapo_last_error(), ":2: not a JSON object"));
  f = fopen(g_metrics, "w");
  fputs("\n", f);
  fclose(f);
  assert_int_equal(slapo_plot_metrics(g_metrics, g_svg), SLAPO_INVALID_ARG);
  assert_non_null(strstr(slapo_last_error(), "holds no step with a loss"));
  f = fopen(g_metrics, "w");
  fputs("{\"step\": 1, \"loss\": 2.0}\n", f);
  fclose(f);
  assert_int_equal(slapo_plot_metrics(g_metrics, "/nonexistent/dir/loss.svg"), SLAPO_IO);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_metrics, sizeof g_metrics, "/tmp/slapo-plot-%d.jsonl", (int)getpid());
  snprintf(g_svg, sizeof g_svg, "/tmp/slapo-plot-%d.svg", (int)getpid());
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(g_metrics);
  unlink(g_svg);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plot_follows_metrics),
      cmocka_unit_test(test_plot_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

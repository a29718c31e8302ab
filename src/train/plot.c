/* train/plot.c - a loss plot from a metrics file (`slapo train --metrics`):
 * a self-contained SVG with training and validation loss against step on
 * top and tokens/s below, written atomically. Each panel's group carries
 * its axis ranges as data-* attributes, so a reader (and the test) can map
 * the points back to the numbers. Layer: train. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/assert.h"
#include "slapo/train.h"

/* The series of one metrics file. */
typedef struct series {
  int64_t n, n_val;
  double *step, *loss, *tps; /* [n] */
  double *vstep, *val;       /* [n_val] */
} series;

static void series_free(series *s) {
  slapo_free(s->step), slapo_free(s->loss), slapo_free(s->tps);
  slapo_free(s->vstep), slapo_free(s->val);
}

static slapo_status grow(series *s, int64_t cap) {
  double **arr[5] = {&s->step, &s->loss, &s->tps, &s->vstep, &s->val};
  for (int i = 0; i < 5; i++) {
    double *p = slapo_realloc(*arr[i], (size_t)cap * sizeof **arr[i]);
    if (!p) return slapo_error(SLAPO_NOMEM, "plot: out of memory");
    *arr[i] = p;
  }
  return SLAPO_OK;
}

/* One metrics line into s; a JSON null (a non-finite value) is skipped. */
static slapo_status take_line(series *s, const char *path, int lineno, const char *line) {
  json_error_t err;
  json_t *o = json_loads(line, 0, &err);
  if (!o || !json_is_object(o)) {
    json_decref(o);
    return slapo_error(SLAPO_PARSE, "plot: %s:%d: not a JSON object: %s", path, lineno,
                       o ? "another JSON value" : err.text);
  }
  json_t *st = json_object_get(o, "step"), *l = json_object_get(o, "loss");
  json_t *t = json_object_get(o, "tokens_per_s"), *v = json_object_get(o, "val_loss");
  slapo_status r = SLAPO_OK;
  if (!json_is_integer(st))
    r = slapo_error(SLAPO_PARSE, "plot: %s:%d: no integer \"step\"", path, lineno);
  else if (json_is_number(l)) {
    s->step[s->n] = (double)json_integer_value(st);
    s->loss[s->n] = json_number_value(l);
    s->tps[s->n++] = json_is_number(t) ? json_number_value(t) : NAN;
    if (json_is_number(v)) s->vstep[s->n_val] = s->step[s->n - 1], s->val[s->n_val++] = json_number_value(v);
  }
  json_decref(o);
  return r;
}

static slapo_status read_series(const char *path, series *s) {
  FILE *f = fopen(path, "r");
  if (!f) return slapo_error(SLAPO_IO, "plot: cannot read %s: %s", path, strerror(errno));
  char line[4096];
  int lineno = 0;
  int64_t cap = 0;
  slapo_status r = SLAPO_OK;
  while (r == SLAPO_OK && fgets(line, sizeof line, f)) {
    lineno++;
    if (line[strspn(line, " \t\r\n")] == '\0') continue;
    if (s->n == cap && (r = grow(s, cap = cap ? 2 * cap : 256)) != SLAPO_OK) break;
    r = take_line(s, path, lineno, line);
  }
  fclose(f);
  if (r == SLAPO_OK && s->n == 0)
    r = slapo_error(SLAPO_INVALID_ARG, "plot: %s holds no step with a loss", path);
  return r;
}

/* A panel: its box on the page and the ranges it maps. */
typedef struct panel {
  double x, y, w, h;
  double x0, x1, y0, y1;
} panel;

static void range(const double *v, int64_t n, double *lo, double *hi) {
  *lo = INFINITY, *hi = -INFINITY;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(v[i])) *lo = fmin(*lo, v[i]), *hi = fmax(*hi, v[i]);
  if (!isfinite(*lo)) *lo = 0, *hi = 1;
  if (*hi - *lo < 1e-12) *lo -= 0.5, *hi += 0.5; /* a flat series */
}

static double px(const panel *p, double v) { return p->x + (v - p->x0) / (p->x1 - p->x0) * p->w; }
static double py(const panel *p, double v) {
  return p->y + p->h - (v - p->y0) / (p->y1 - p->y0) * p->h;
}

static void open_panel(FILE *f, const panel *p, const char *id, const char *ylabel) {
  fprintf(f, "<g id=\"%s\" data-x-min=\"%.17g\" data-x-max=\"%.17g\" data-y-min=\"%.17g\" "
             "data-y-max=\"%.17g\" data-box=\"%g %g %g %g\">\n",
          id, p->x0, p->x1, p->y0, p->y1, p->x, p->y, p->w, p->h);
  fprintf(f, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"#888\"/>\n",
          p->x, p->y, p->w, p->h);
  for (int k = 0; k <= 4; k++) { /* y ticks */
    double v = p->y0 + (p->y1 - p->y0) * k / 4.0;
    fprintf(f, fabs(v) >= 1000 ? "<text x=\"%g\" y=\"%.2f\" font-size=\"11\" "
                                 "text-anchor=\"end\">%.0f</text>\n"
                               : "<text x=\"%g\" y=\"%.2f\" font-size=\"11\" "
                                 "text-anchor=\"end\">%.4g</text>\n",
            p->x - 6, py(p, v) + 4, v);
  }
  for (int k = 0; k <= 4; k++) { /* x ticks */
    double v = p->x0 + (p->x1 - p->x0) * k / 4.0;
    fprintf(f, "<text x=\"%.2f\" y=\"%g\" font-size=\"11\" text-anchor=\"middle\">%.0f</text>\n",
            px(p, v), p->y + p->h + 14, v);
  }
  fprintf(f, "<text x=\"%g\" y=\"%g\" font-size=\"12\" transform=\"rotate(-90 %g %g)\" "
             "text-anchor=\"middle\">%s</text>\n",
          p->x - 62, p->y + p->h / 2, p->x - 62, p->y + p->h / 2, ylabel);
}

static void polyline(FILE *f, const panel *p, const char *cls, const char *color,
                     const double *x, const double *y, int64_t n) {
  fprintf(f, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
          cls, color);
  for (int64_t i = 0; i < n; i++)
    if (isfinite(y[i])) fprintf(f, "%s%.3f,%.3f", i ? " " : "", px(p, x[i]), py(p, y[i]));
  fprintf(f, "\"/>\n");
}

typedef struct plot_job {
  const series *s;
  const char *title;
} plot_job;

static slapo_status write_svg(FILE *f, const char *tmp, void *ud) {
  (void)tmp;
  const plot_job *j = ud;
  const series *s = j->s;
  panel top = {80, 40, 690, 300, 0, 0, 0, 0}, bot = {80, 390, 690, 110, 0, 0, 0, 0};
  range(s->step, s->n, &top.x0, &top.x1);
  double vlo, vhi;
  range(s->loss, s->n, &top.y0, &top.y1);
  range(s->val, s->n_val, &vlo, &vhi);
  if (s->n_val) top.y0 = fmin(top.y0, vlo), top.y1 = fmax(top.y1, vhi);
  bot.x0 = top.x0, bot.x1 = top.x1;
  range(s->tps, s->n, &bot.y0, &bot.y1);
  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
             "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"800\" height=\"540\" "
             "viewBox=\"0 0 800 540\" font-family=\"sans-serif\">\n"
             "<rect width=\"800\" height=\"540\" fill=\"white\"/>\n"
             "<text x=\"400\" y=\"22\" font-size=\"14\" text-anchor=\"middle\">%s</text>\n",
          j->title);
  open_panel(f, &top, "loss-panel", "loss");
  polyline(f, &top, "loss", "#1f77b4", s->step, s->loss, s->n);
  if (s->n_val) polyline(f, &top, "val_loss", "#d62728", s->vstep, s->val, s->n_val);
  for (int64_t i = 0; i < s->n_val; i++)
    fprintf(f, "<circle cx=\"%.3f\" cy=\"%.3f\" r=\"3\" fill=\"#d62728\"/>\n",
            px(&top, s->vstep[i]), py(&top, s->val[i]));
  fprintf(f, "<text x=\"%g\" y=\"%g\" font-size=\"12\" fill=\"#1f77b4\">loss</text>\n"
             "<text x=\"%g\" y=\"%g\" font-size=\"12\" fill=\"#d62728\">val_loss</text>\n</g>\n",
          top.x + top.w - 90, top.y + 16, top.x + top.w - 50, top.y + 16);
  open_panel(f, &bot, "tps-panel", "tokens/s");
  polyline(f, &bot, "tokens_per_s", "#2ca02c", s->step, s->tps, s->n);
  fprintf(f, "<text x=\"%g\" y=\"%g\" font-size=\"12\" text-anchor=\"middle\">step</text>\n"
             "</g>\n</svg>\n",
          bot.x + bot.w / 2, bot.y + bot.h + 30);
  if (ferror(f)) return slapo_error(SLAPO_IO, "plot: writing %s failed", tmp);
  return SLAPO_OK;
}

slapo_status slapo_plot_metrics(const char *metrics_path, const char *svg_path) {
  series s = {0};
  slapo_status r = read_series(metrics_path, &s);
  if (r == SLAPO_OK) {
    char title[512];
    /* The title is the metrics file's name, with the XML specials left out. */
    size_t k = 0;
    for (const char *p = metrics_path; *p && k + 1 < sizeof title; p++)
      if (!strchr("<>&\"'", *p)) title[k++] = *p;
    title[k] = '\0';
    plot_job j = {&s, title};
    r = slapo_write_atomic(svg_path, "plot", write_svg, &j);
  }
  series_free(&s);
  return r;
}

// A small line chart on a canvas: a rolling window of points per series (one a second), redrawn
// per push. The time axis spans what has been seen, from 30 s up to the capacity, so a freshly
// opened dashboard is readable at once. Colours come from the page's CSS variables, so it
// follows light and dark mode.

export class LineChart {
  // integer: the values are counts, so the axis steps in whole numbers.
  constructor(canvas, seriesCount, { capacity = 180, integer = false, minSpan = 30 } = {}) {
    this.minSpan = minSpan;
    this.canvas = canvas;
    this.capacity = capacity;
    this.integer = integer;
    this.series = Array.from({ length: seriesCount }, () => []);
    new ResizeObserver(() => this.draw()).observe(canvas);
  }

  push(values) {
    this.add(values);
    this.draw();
  }

  // Several samples at once (a new dashboard's history), oldest first, drawn once.
  extend(rows) {
    rows.forEach((values) => this.add(values));
    this.draw();
  }

  add(values) {
    values.forEach((v, i) => {
      const points = this.series[i];
      points.push(v === null || v === undefined ? null : Number(v));
      if (points.length > this.capacity) points.shift();
    });
    // how many samples it holds, for a reader of the page (the canvas shows them)
    this.canvas.dataset.samples = String(Math.max(...this.series.map((p) => p.length)));
  }

  draw() {
    const { canvas } = this;
    const ratio = window.devicePixelRatio || 1;
    const w = canvas.clientWidth;
    const h = canvas.clientHeight;
    if (!w || !h) return;
    canvas.width = Math.round(w * ratio);
    canvas.height = Math.round(h * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const css = getComputedStyle(document.documentElement);
    const color = (name) => css.getPropertyValue(name).trim();
    const all = this.series.flat().filter((v) => v !== null);
    const highest = all.length ? Math.max(...all) : 0;
    const top = this.integer ? Math.max(4, 4 * Math.ceil(niceMax(highest) / 4)) : niceMax(highest);
    const left = 40;
    const bottom = h - 16;
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = color("--muted");
    ctx.strokeStyle = color("--grid");
    ctx.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = 6 + ((bottom - 6) * i) / 4;
      ctx.beginPath();
      ctx.moveTo(left, y);
      ctx.lineTo(w, y);
      ctx.stroke();
      ctx.fillText(formatTick((top * (4 - i)) / 4), 2, y + 4);
    }
    const seen = Math.max(...this.series.map((p) => p.length));
    const span = Math.min(this.capacity, Math.max(this.minSpan, seen));
    ctx.fillText(span < 120 ? `last ${span} s` : `last ${Math.round(span / 60)} min`, left, h - 2);
    const step = (w - left) / Math.max(1, span - 1);
    this.series.forEach((points, s) => {
      ctx.strokeStyle = color(`--series-${s + 1}`);
      ctx.lineWidth = 2;
      ctx.beginPath();
      let drawing = false;
      const offset = span - points.length;
      points.forEach((v, i) => {
        if (v === null) {
          drawing = false;
          return;
        }
        const x = left + (offset + i) * step;
        const y = bottom - ((bottom - 6) * v) / top;
        if (drawing) ctx.lineTo(x, y);
        else ctx.moveTo(x, y);
        drawing = true;
      });
      ctx.stroke();
      // a point with no neighbour draws no line: mark it so a first sample is visible
      ctx.fillStyle = ctx.strokeStyle;
      points.forEach((v, i) => {
        const alone = v !== null && (points[i - 1] ?? null) === null && (points[i + 1] ?? null) === null;
        if (!alone) return;
        ctx.beginPath();
        ctx.arc(left + (offset + i) * step, bottom - ((bottom - 6) * v) / top, 2.5, 0, 2 * Math.PI);
        ctx.fill();
      });
    });
  }
}

function niceMax(v) {
  if (v <= 0) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * magnitude) return m * magnitude;
  return 10 * magnitude;
}

function formatTick(v) {
  if (v >= 1000) return `${(v / 1000).toFixed(v >= 10000 ? 0 : 1)}k`;
  return Number.isInteger(v) ? String(v) : String(Number(v.toFixed(2)));
}

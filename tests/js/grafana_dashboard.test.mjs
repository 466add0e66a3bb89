// Type-checks deploy/grafana/dashboards/*.json against Grafana's own types
// (@grafana/schema, npm): the dashboard, its variables and rows against
// `Dashboard`, each stat and time-series panel's options and field config
// against that panel plugin's `Options` and `FieldConfig`, and each query
// against a Prometheus query (refId, expr, legendFormat, ...). TypeScript
// compiles a generated module in memory (`const d: Json<Dashboard> = <the
// file>`), so a misspelt key, a wrong type or a value outside an enum is a
// compile error with its line in the JSON. A second compile of a broken copy
// must fail: the check can fail. Then the layout: the rows in order,
// unique panel ids, every panel on the grid, every query on the
// `${datasource}` variable. (The queries themselves run against a live
// Prometheus in src/cli/monitoring_e2e_test.cc.)
//
// Run: node --test tests/js/grafana_dashboard.test.mjs (ctest grafana_dashboard).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const here = dirname(fileURLToPath(import.meta.url));
const dashboardsDir = join(here, '../../deploy/grafana/dashboards');
const rowsWanted = ['Node health', 'Requests', 'Admission', 'KV cache', 'HiCache', 'PD', 'Router'];

// Grafana's string enums (ThresholdsMode, MappingType, BigValueColorMode, ...)
// are TypeScript enums, which a JSON string can never be; Json<T> turns each
// into the union of its values ("absolute" | "percentage"), recursively, and
// leaves everything else (optional keys, excess-key checks) as it is.
const prelude = `
import type { Dashboard, DataSourceRef } from '@grafana/schema';
import type * as Stat from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type * as TimeSeries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';
type Json<T> = T extends string ? \`\${T}\` : T extends readonly (infer U)[] ? Json<U>[] : T extends object ? { [K in keyof T]: Json<T[K]> } : T;
interface PrometheusQuery { refId: string; datasource: DataSourceRef; expr: string; legendFormat?: string; range?: boolean; instant?: boolean; hide?: boolean; }
`;

// One module: the whole dashboard, then per panel its options, custom field
// config and queries against the plugin's types. Returns the source and the
// line where the dashboard's JSON starts.
function moduleFor(dashboard, text) {
  let src = prelude + 'export const dashboard: Json<Dashboard> =\n';
  const jsonLine = src.split('\n').length;
  src += text + ';\n';
  dashboard.panels.forEach((p, i) => {
    const plugin = { stat: 'Stat', timeseries: 'TimeSeries' }[p.type];
    if (p.type === 'row') return;
    if (!plugin) {
      src += `export const unknown_${i}: "stat" | "timeseries" | "row" = ${JSON.stringify(p.type)};\n`;
      return;
    }
    src += `export const options_${i}: Json<${plugin}.Options> = ${JSON.stringify(p.options)};\n`;
    if (plugin === 'TimeSeries')
      src += `export const custom_${i}: Json<TimeSeries.FieldConfig> = ${JSON.stringify(p.fieldConfig?.defaults?.custom ?? {})};\n`;
    src += `export const targets_${i}: PrometheusQuery[] = ${JSON.stringify(p.targets ?? [])};\n`;
  });
  return { src, jsonLine };
}

// Compiles `src` as `check.ts` beside node_modules; returns the diagnostics
// as "line N: message" (N in the JSON file for errors inside it).
function typeErrors(src, jsonLine, jsonLines) {
  const file = join(here, 'grafana_dashboard_check.ts');
  const options = {
    strict: true,
    noEmit: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    skipLibCheck: true,
    types: [],
  };
  const host = ts.createCompilerHost(options);
  const read = host.readFile.bind(host);
  const getSource = host.getSourceFile.bind(host);
  host.readFile = (f) => (f === file ? src : read(f));
  host.fileExists = ((exists) => (f) => f === file || exists(f))(host.fileExists.bind(host));
  host.getSourceFile = (f, lang, ...rest) =>
    f === file ? ts.createSourceFile(f, src, lang) : getSource(f, lang, ...rest);
  const program = ts.createProgram([file], options, host);
  return ts.getPreEmitDiagnostics(program).map((d) => {
    const msg = ts.flattenDiagnosticMessageText(d.messageText, '\n');
    if (!d.file || d.start === undefined) return msg;
    const line = d.file.getLineAndCharacterOfPosition(d.start).line + 1;
    const inJson = line >= jsonLine && line < jsonLine + jsonLines;
    return inJson ? `dashboard line ${line - jsonLine + 1}: ${msg}` : `generated line ${line}: ${msg}`;
  });
}

const files = readdirSync(dashboardsDir).filter((f) => f.endsWith('.json'));

test('there is a dashboard', () => assert.ok(files.length > 0, dashboardsDir));

for (const f of files) {
  const text = readFileSync(join(dashboardsDir, f), 'utf8');
  const dashboard = JSON.parse(text);

  test(`${f} type-checks against @grafana/schema`, () => {
    const { src, jsonLine } = moduleFor(dashboard, text);
    const errors = typeErrors(src, jsonLine, text.split('\n').length);
    assert.deepEqual(errors, []);
  });

  // TypeScript reports a misspelt key only where nothing inside the object is
  // wrong too, so the misspelt keys are a copy of their own.
  const breakages = {
    'wrong values': [
      (d) => (d.panels.find((p) => p.type === 'stat').fieldConfig.defaults.thresholds.mode = 'absolut'),
      (d) => (d.panels.find((p) => p.type === 'stat').options.colorMode = 'backgrund'),
      (d) => (d.panels.find((p) => p.type === 'timeseries').gridPos.w = '8'),
      ['"absolut"', '"backgrund"', "Type 'string' is not assignable to type 'number'"],
    ],
    'misspelt keys': [(d) => (d.refreshh = '10s'), ['"refreshh"']],
  };
  for (const [what, steps] of Object.entries(breakages)) {
    test(`${f}: a copy with ${what} does not type-check (the check can fail)`, () => {
      const broken = structuredClone(dashboard);
      const wants = steps.pop();
      for (const step of steps) step(broken);
      const brokenText = JSON.stringify(broken, null, 2);
      const { src, jsonLine } = moduleFor(broken, brokenText);
      const errors = typeErrors(src, jsonLine, brokenText.split('\n').length).join('\n');
      for (const want of wants) assert.ok(errors.includes(want), `no error mentions ${want}:\n${errors}`);
    });
  }

  test(`${f}: the rows, ids, grid and datasource`, () => {
    const rows = dashboard.panels.filter((p) => p.type === 'row').map((p) => p.title);
    assert.deepEqual(rows, rowsWanted);
    assert.equal(dashboard.panels[0].type, 'row', 'the first panel is a row');
    const ids = dashboard.panels.map((p) => p.id);
    assert.equal(new Set(ids).size, ids.length, 'panel ids are unique');
    let lastY = -1;
    for (const p of dashboard.panels) {
      const g = p.gridPos;
      assert.ok(g && g.x >= 0 && g.x + g.w <= 24 && g.h > 0, `${p.title}: on the 24-column grid`);
      assert.ok(g.y >= lastY, `${p.title}: panels are in reading order`);
      lastY = g.y;
      if (p.type === 'row') {
        assert.deepEqual(p.panels, [], `${p.title}: an open row holds no panels of its own`);
        continue;
      }
      assert.ok(p.title && p.description, `panel ${p.id} has a title and a description`);
      assert.equal(p.datasource?.uid, '${datasource}', `${p.title}: uses the datasource variable`);
      assert.ok(p.targets.length > 0, `${p.title}: has queries`);
      for (const t of p.targets) {
        assert.equal(t.datasource?.uid, '${datasource}', `${p.title} ${t.refId}`);
        assert.ok(t.expr.trim().length > 0, `${p.title} ${t.refId}: has an expression`);
      }
    }
    const vars = dashboard.templating.list.map((v) => v.name);
    assert.deepEqual(vars, ['datasource', 'node', 'service']);
  });
}

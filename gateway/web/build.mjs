// Builds the console's pages into dist/: one script and one style sheet, named by their
// content's hash, and the index.html that names them. Run by `make web` (npm run build).
import * as esbuild from 'esbuild';
import { readFileSync, writeFileSync, rmSync, mkdirSync } from 'node:fs';
import { basename } from 'node:path';

rmSync('dist/assets', { recursive: true, force: true });
rmSync('dist/index.html', { force: true });
mkdirSync('dist/assets', { recursive: true });
const result = await esbuild.build({
  entryPoints: { app: 'src/main.jsx' },
  bundle: true,
  minify: true,
  sourcemap: false,
  format: 'esm',
  target: ['chrome110', 'firefox115', 'safari16'],
  jsx: 'automatic',
  jsxImportSource: 'preact',
  entryNames: '[name]-[hash]',
  outdir: 'dist/assets',
  metafile: true,
  legalComments: 'linked',
  logLevel: 'warning',
});
const outputs = Object.keys(result.metafile.outputs).map((p) => basename(p));
const js = outputs.find((f) => f.endsWith('.js'));
const css = outputs.find((f) => f.endsWith('.css'));
const html = readFileSync('src/index.html', 'utf8')
  .replace('%SCRIPT%', `assets/${js}`)
  .replace('%STYLE%', `assets/${css}`);
writeFileSync('dist/index.html', html);
console.log(`web: dist/index.html, dist/assets/${js}, dist/assets/${css}`);

// `strata serve` as a child process for the JS client tests: started on a
// free port (--port 0, read back from its "serving ... on http://127.0.0.1:N"
// line), stopped with SIGTERM (resolves to its exit code, 0 after a drain).
// STRATA_BINARY names the binary (ctest sets it).
import { spawn } from 'node:child_process';

// args: everything after `strata serve` but the port and thread count.
export function startServer(args, { timeoutMs = 30000 } = {}) {
  const bin = process.env.STRATA_BINARY;
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, ['serve', '--port', '0', '--threads', '1', ...args],
                       { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    const timer = setTimeout(() => reject(new Error(`server did not start: ${log}`)), timeoutMs);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/serving '[^']*' on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve({ proc, port: Number(m[1]), log: () => log }); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited ${code}: ${log}`)); });
  });
}

export function stopServer(s) {
  return new Promise((resolve) => {
    s.proc.removeAllListeners('exit');
    s.proc.on('exit', (code) => resolve(code));
    s.proc.kill('SIGTERM');
  });
}

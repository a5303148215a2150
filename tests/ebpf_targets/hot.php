<?php
// A target for tests/ebpf_runtimes.rs: two hot functions at a 2:1 CPU split,
// run by PHP as it is (the receiver walks the VM's frames; no extension or
// flag). Each round's length is random (1 to 8 units, the same for both
// functions). The functions are called from a method, itself called from a
// function called by the file's own code, so a stack reads
// {main} → main → Runner::run → proflow_hot_two.
// Usage: php hot.php SECONDS. Prints "ready PID" when it starts spinning and
// "rounds N" when it ends.

const N = 20000;

function proflow_hot_two($k)
{
    $s = 0;
    $n = 2 * $k * N;
    for ($i = 0; $i < $n; $i++) {
        $s += $i;
    }
    return $s;
}

function proflow_hot_one($k)
{
    $s = 0;
    $n = $k * N;
    for ($i = 0; $i < $n; $i++) {
        $s += $i;
    }
    return $s;
}

class Runner
{
    public function run($seconds)
    {
        $end = hrtime(true) + (int) ($seconds * 1e9);
        $rounds = 0;
        while (hrtime(true) < $end) {
            $k = mt_rand(1, 8);
            proflow_hot_two($k);
            proflow_hot_one($k);
            $rounds++;
        }
        return $rounds;
    }
}

function main($argv)
{
    $seconds = isset($argv[1]) ? (float) $argv[1] : 30.0;
    echo "ready " . getmypid() . "\n";
    flush();
    $rounds = (new Runner())->run($seconds);
    echo "rounds $rounds\n";
}

main($argv);

# A target for tests/ebpf_runtimes.rs: two hot methods at a 2:1 CPU split, run
# by Ruby as it is (the receiver walks the VM's control frames; no flag or
# gem). Each round's length is random (1 to 8 units, the same for both
# methods). The methods are called from a method of a class, itself called
# from a method called by the file's own code, so a stack reads
# <main> -> main -> run -> proflow_hot_two.
# Usage: ruby hot.rb SECONDS. Prints "ready PID" when it starts spinning and
# "rounds N" when it ends.

N = 20_000

def proflow_hot_two(k)
  s = 0
  n = 2 * k * N
  i = 0
  while i < n
    s += i
    i += 1
  end
  s
end

def proflow_hot_one(k)
  s = 0
  n = k * N
  i = 0
  while i < n
    s += i
    i += 1
  end
  s
end

class Runner
  def run(seconds)
    finish = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    rounds = 0
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < finish
      k = 1 + rand(8)
      proflow_hot_two(k)
      proflow_hot_one(k)
      rounds += 1
    end
    rounds
  end
end

def main
  seconds = ARGV.empty? ? 30.0 : ARGV[0].to_f
  $stdout.sync = true
  puts "ready #{Process.pid}"
  rounds = Runner.new.run(seconds)
  puts "rounds #{rounds}"
end

main

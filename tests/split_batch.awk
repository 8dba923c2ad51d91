# Cuts the output of one `refit-run CONFIG...` job (a batch: several test
# scenarios in one MPI job) into each config's own part. refit-run opens each
# config with "refit-run: config I of N: PATH" and closes it with
# "refit-run: config I of N ended: exit status S (T s)".
#
#   awk -v sections=TABLE -f split_batch.awk JOB_OUTPUT
#
# TABLE has a line per config, in the job's order: PATH<TAB>PREFIX. Config
# I's lines go to PREFIX.out, its exit status to PREFIX.rc and its seconds to
# PREFIX.seconds; a config the job never ended has no PREFIX.rc. Lines up to
# the next config's opening line stay with the config before (other ranks'
# stderr may come late); those after the last config's end are the
# launcher's and go nowhere. An opening line that names another PATH than
# the table's is reported on stdout and its part dropped. The only parser of
# this output: tests/mpi/run_batch.sh and tests/reference/run_reference.py
# both use it.
BEGIN {
  FS = "\t"
  while ((getline line < sections) > 0) { split(line, f); path[++n] = f[1]; to[n] = f[2] }
  FS = " "
}
/^refit-run: config [0-9]+ of [0-9]+ ended: exit status / {
  k = $3 + 0
  if (out != "") {
    print $9 > (to[k] ".rc"); close(to[k] ".rc")
    seconds = $10; gsub(/[(]/, "", seconds)
    print seconds > (to[k] ".seconds"); close(to[k] ".seconds")
  }
  if (k == n) { close(out); out = "" }
  next
}
match($0, /^refit-run: config [0-9]+ of [0-9]+: /) {
  k = $3 + 0
  if (out != "") close(out)
  out = to[k] ".out"
  printf "" > out
  if (substr($0, RLENGTH + 1) != path[k]) {
    print "split_batch: config " k " is " substr($0, RLENGTH + 1) ", expected " path[k]
    out = ""
  }
  next
}
out != "" { print > out }

#!/bin/sh
# bench-plots.sh CSV OUTDIR -- draws the size sweep of `gpuarr-bench --csv` as PNGs with gnuplot:
# rate (GB/s) against size (log-log), one picture per section, host cast kernels and device
# (OUTDIR/<machine tag>-<section>[-<kernels>][-<device>].png). Each gpuarr path is a solid line;
# its baselines are dashed grey lines: the mean at each size of that baseline's same-run medians
# over the paths of the picture (every path is timed against its own repetitions of it).
# The machine tag, CPU, devices and date come from the CSV's `# ` header lines. `make bench-plots`
# runs it; it needs gnuplot (Debian: gnuplot-nox).
set -eu
csv=$1 out=$2
command -v gnuplot >/dev/null 2>&1 || { echo "bench-plots: gnuplot not found (Debian: apt-get install gnuplot-nox)"; exit 1; }
[ -s "$csv" ] || { echo "bench-plots: $csv is missing or empty"; exit 1; }
header() { sed -n "s/^# $1: //p" "$csv" | head -1; }
tag=$(header "machine tag")
cpu=$(header cpu | sed 's/), .*/)/')
date=$(header date)
[ -n "$tag" ] || { echo "bench-plots: $csv has no '# machine tag:' line (not made by gpuarr-bench --csv?)"; exit 1; }
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One folder per picture: g<N>/name (the PNG's name), g<N>/title, and per series s<M>.dat
# ("bytes GBps" lines) with s<M>.label and s<M>.kind (gpuarr or baseline).
awk -F, -v work="$work" -v tag="$tag" '
    /^#/ || $1 == "section" || NF < 14 { next }
    {
        key = $1 SUBSEP $4 SUBSEP $5
        if (!(key in group)) {
            group[key] = ++ngroups
            name = tag "-" $1
            if ($4 != "-") name = name "-" $4
            if ($5 != "host") name = name "-" $5
            gsub(/[^A-Za-z0-9.-]+/, "-", name)
            print name > (work "/g" ngroups ".name")
            title = $1
            if ($4 != "-") title = title ", host cast kernels " $4
            if ($5 != "host") title = title ", " $5
            print title > (work "/g" ngroups ".title")
        }
        g = group[key]
        pk = g SUBSEP "p" SUBSEP $2
        if (!(pk in series)) { series[pk] = ++nseries[g]; kind[g, series[pk]] = "gpuarr"; label[g, series[pk]] = "gpuarr " $2 }
        bk = g SUBSEP "b" SUBSEP $3
        if (!(bk in series)) { series[bk] = ++nseries[g]; kind[g, series[bk]] = "baseline"; label[g, series[bk]] = $3 " (baseline)" }
        # a path measured against two baselines has one line: its first row at each size
        s = series[pk]
        if (!((g, s, $6) in val)) { val[g, s, $6] = $9; sizes[g, s] = sizes[g, s] " " $6 }
        s = series[bk]
        sum[g, s, $6] += $10; cnt[g, s, $6]++
        if (cnt[g, s, $6] == 1) sizes[g, s] = sizes[g, s] " " $6
    }
    END {
        for (g = 1; g <= ngroups; g++)
            for (s = 1; s <= nseries[g]; s++) {
                f = work "/g" g "-s" s
                print label[g, s] > (f ".label")
                print kind[g, s] > (f ".kind")
                n = split(sizes[g, s], b, " ")
                for (i = 1; i <= n; i++)
                    print b[i], (kind[g, s] == "gpuarr" ? val[g, s, b[i]] : sum[g, s, b[i]] / cnt[g, s, b[i]]) > (f ".dat")
            }
    }
' "$csv"

# the x range a little wider than the sizes, so that the last tic keeps its label
xmin=$(awk -F, '!/^#/ && $1 != "section" && NF >= 14 { if (!m || $6 < m) m = $6 } END { print m / 1.25 }' "$csv")
xmax=$(awk -F, '!/^#/ && $1 != "section" && NF >= 14 { if ($6 > m) m = $6 } END { print m * 1.25 }' "$csv")
count=0
for namefile in "$work"/g*.name; do
    [ -e "$namefile" ] || { echo "bench-plots: no data rows in $csv"; exit 1; }
    g=${namefile%.name}
    name=$(cat "$namefile")
    plot="" color=0 dash=1
    for dat in "$g"-s*.dat; do
        s=${dat%.dat}
        label=$(sed 's/"/\\"/g' "$s.label")
        if [ "$(cat "$s.kind")" = gpuarr ]; then
            color=$((color + 1))
            style="lw 2.5 lc $color dt 1 pt 7 ps 0.7"
        else
            dash=$((dash + 1))
            style="lw 2 lc rgb '#555555' dt $dash pt 6 ps 0.7"
        fi
        plot="$plot${plot:+, }'$dat' using 1:2 with linespoints $style title \"$label\""
    done
    gnuplot <<EOF
set terminal pngcairo size 1200,850 font "sans,11"
set output "$out/$name.png"
set title "$(cat "$g.title")\n$cpu, $tag, $date" noenhanced
set logscale x 2
set xrange [$xmin:$xmax]
set logscale y 10
set xlabel "size of the source array (bytes)"
set ylabel "rate, GB/s (casts and memcpy: bytes read + written)"
set xtics ("4K" 4096, "16K" 16384, "64K" 65536, "256K" 262144, "1M" 1048576, "4M" 4194304, "16M" 16777216, "64M" 67108864, "256M" 268435456, "1G" 1073741824)
set ytics ("0.01" 0.01, "0.02" 0.02, "0.05" 0.05, "0.1" 0.1, "0.2" 0.2, "0.5" 0.5, "1" 1, "2" 2, "5" 5, "10" 10, "20" 20, "50" 50, "100" 100, "200" 200, "500" 500)
set grid xtics ytics
set key below left maxcols 2 noenhanced
plot $plot
EOF
    count=$((count + 1))
    echo "bench-plots: $out/$name.png"
done
echo "bench-plots: $count pictures from $csv"

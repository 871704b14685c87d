# names.sh - sourced by up.sh and down.sh: the names a test cluster in $DIR gives what lives
# outside any directory (interfaces, network namespaces), unique to DIR so that two clusters in
# two directories never meet. Sets HASH (a number from DIR's sha256), NAME (DRUN_SLURM_PREFIX, else
# "ds" and 6 hex digits of it), BR (bridge), NSP (namespaces NSP1...), VETH (host-side veths
# VETH1...); interface names stay within 15 characters.
HASH_HEX=$(printf %s "$DIR" | sha256sum | cut -c1-6)
HASH=$((16#$HASH_HEX))
NAME=${DRUN_SLURM_PREFIX:-ds$HASH_HEX}
BR="$NAME-br"
NSP="$NAME-n"
VETH="$NAME-v"

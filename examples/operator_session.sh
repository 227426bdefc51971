#!/bin/sh
# A bot runs in one process; from another, the operator inspects, exports and erases one
# user's data, then proves she is gone while the bot chats on.
# Usage: sh examples/operator_session.sh [WORK_DIR]   (default: a new temporary folder)
set -eu
WORK=${1:-$(mktemp -d)}
STATE=$WORK/state
mkfifo "$WORK/bot.in"
python3 "$(dirname "$0")/operator_bot.py" "$STATE" <"$WORK/bot.in" >"$WORK/bot.log" &
exec 3>"$WORK/bot.in"   # the bot's stdin: one chat line per message
until grep -q '^ready' "$WORK/bot.log"; do sleep 0.1; done

activememory sessions --state-dir "$STATE"
activememory search zebra --caller agent:main:direct:dana --state-dir "$STATE"
activememory records search zebra --user dana --state-dir "$STATE"
activememory export --identity dana -o "$WORK/dana.jsonl" --state-dir "$STATE"
activememory erase --identity dana --dry-run --state-dir "$STATE"
activememory erase --identity dana --state-dir "$STATE"   # the bot runs it

activememory search zebra --caller agent:main:direct:dana --state-dir "$STATE"
activememory records search zebra --user dana --state-dir "$STATE"
activememory export --identity dana --state-dir "$STATE"
grep -rl zebra "$STATE" || echo "no file of the state directory holds 'zebra'"

echo "alice: the hive swarmed today" >&3
until grep -q swarmed "$WORK/bot.log"; do sleep 0.1; done
activememory history agent:main:direct:alice --state-dir "$STATE"
exec 3>&-   # the bot's stdin closes: it stops
wait

#!/usr/bin/env bash
# librdmachan exports its own namespace only (cmake/exported_symbols.map): a dynamic symbol of
# Boost, spdlog, fmt, nlohmann/json or the standard library's templates would be bound in place of
# the application's own copy built from other headers, or the application's in place of ours.
# Fails naming each symbol exported outside rdmachan's namespace, and if rdmachan's own are gone.
#   exported_symbols_test.sh LIBRARY
set -euo pipefail
library=$1
symbols=$(nm -DC --defined-only "$library" | cut -d' ' -f3-)
own='^((typeinfo( name)?|vtable|VTT|guard variable) for |(virtual|non-virtual|covariant return) thunk to )?rdmachan::'
foreign=$(grep -Ev "$own" <<<"$symbols" || true)
if [ -n "$foreign" ]; then
    echo "exported_symbols_test: $library exports $(wc -l <<<"$foreign") symbols outside rdmachan's namespace:"
    head -n 20 <<<"$foreign"
    exit 1
fi
# The application catches the library's exceptions by type and calls its functions.
for needed in 'typeinfo for rdmachan::Error' 'rdmachan::ChannelBuilder::'; do
    if ! grep -qF "$needed" <<<"$symbols"; then
        echo "exported_symbols_test: $library does not export $needed"
        exit 1
    fi
done
echo "exported_symbols_test: $(wc -l <<<"$symbols") symbols exported, all of rdmachan's namespace"

_cxl__accel() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="cxl__accel"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        cxl__accel)
            opts="-h -V --socket-path --fd --socket-mode --memory-path --memory-size --virtio-id --queue-size --dma-threads --cmd-queues --inline-max --poll-us --index --peer-memory-path --attach --cxl-host-bridge --cxl-host-bridges --qemu-cxl-mem-bar --seccomp --supervise --socket-group --state-path --control-socket --control-fd --worker-fd --resume --print-qemu-args --print-capabilities --guest-ram --ram-node --reconnect-ms --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --socket-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --fd)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --socket-mode)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --memory-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --memory-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --virtio-id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --queue-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dma-threads)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cmd-queues)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --inline-max)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --poll-us)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --index)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --peer-memory-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --attach)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cxl-host-bridge)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cxl-host-bridges)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seccomp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --socket-group)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --state-path)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --control-socket)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --control-fd)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --worker-fd)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --guest-ram)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ram-node)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --reconnect-ms)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _cxl__accel -o nosort -o bashdefault -o default cxl-accel
else
    complete -F _cxl__accel -o bashdefault -o default cxl-accel
fi

// Command haptic is the HAPTIC agent and the operator's tools around it.
//
//	haptic agent [flags]                    run the agent beside HAProxy
//	haptic agent state [flags]              print the agent's state
//	haptic agent health [flags]             liveness probe over the admin socket
//	haptic agent drain [flags]              preStop hook: wait on the drain socket
//	haptic plan DIR                         print the plan of a directory
//	haptic diff [flags] OLD NEW             does this change reload, and why?
//	haptic diff --agent URL [flags] DIR     the same, against a live agent
//	haptic push --agent URL [flags] DIR     push a directory to agents
//	haptic push --agents-dns URL [flags] DIR
//	                                        the same, to every agent a DNS name lists
//	haptic check [flags] DIR                haproxy -c and the socket check, before a push
//	haptic demo [--haproxy PATH]            the whole flow in one process
//	haptic install DIR                      copy this binary into DIR (an initContainer)
//	haptic certs [flags] DIR                a development CA and mutual-TLS identities
//	haptic version                          which build this is
//
// Every subcommand is a function of its arguments, its standard streams, and
// the environment and name resolver it is handed, in a file named for it (state.go holds agent
// state and health, prestop.go agent drain and install); main.go dispatches.
// fleet.go names a fleet by DNS for push and agent state, fleetstate.go
// prints a fleet's state. agentclient.go holds the one set of client TLS
// flags every command that reaches agents over the network takes, and
// version.go the build's version the agent reports.
package main

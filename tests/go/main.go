// memtune's test tool for Ollama Modelfiles (tests/test_modelfile.py): reads a Modelfile with Ollama's own parser
// (parser.go) and renders its TEMPLATE for each conversation with Ollama's template semantics (template.go), in a
// real Go text/template.
//
//	go run ./tests/go requests.json  ->  JSON on stdout:
//	{"commands": [[name, args]...] | "parse_error": "...", "template": "...",
//	 "renders": [{"text": "..."} | {"error": "..."}]}
//
// requests.json: {"modelfile": "path/to/Modelfile", "conversations": [[{"role": "user", "content": "..."}...]...]}
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
)

type request struct {
	Modelfile     string      `json:"modelfile"`
	Conversations [][]Message `json:"conversations"`
}

type render struct {
	Text  *string `json:"text,omitempty"`
	Error string  `json:"error,omitempty"`
}

func main() {
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		panic(err)
	}
	var req request
	if err := json.Unmarshal(data, &req); err != nil {
		panic(err)
	}
	out := map[string]any{}
	file, err := os.Open(req.Modelfile)
	if err != nil {
		panic(err)
	}
	defer file.Close()
	modelfile, err := ParseFile(file)
	if err != nil {
		out["parse_error"] = err.Error()
		write(out)
		return
	}
	commands := [][]string{}
	source := ""
	for _, c := range modelfile.Commands {
		commands = append(commands, []string{c.Name, c.Args})
		if c.Name == "template" {
			source = c.Args
		}
	}
	out["commands"] = commands
	out["template"] = source
	tmpl := DefaultTemplate
	if source != "" {
		if tmpl, err = Parse(source); err != nil {
			out["template_error"] = err.Error()
			write(out)
			return
		}
	}
	renders := []render{}
	for _, messages := range req.Conversations {
		var b bytes.Buffer
		if err := tmpl.Execute(&b, messages); err != nil {
			renders = append(renders, render{Error: err.Error()})
		} else {
			text := b.String()
			renders = append(renders, render{Text: &text})
		}
	}
	out["renders"] = renders
	write(out)
}

func write(out map[string]any) {
	data, err := json.Marshal(out)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(data))
}
